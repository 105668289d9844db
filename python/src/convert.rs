//! Conversions between Python objects and the JSON values the engine records in its ledger.

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

/// A value that has no JSON form, with where it was found (`items[2].sku`).
#[derive(Debug)]
pub(crate) struct NotJson {
    pub(crate) path: String,
    pub(crate) type_name: String,
    pub(crate) why: &'static str,
}

fn bad(obj: &Bound<'_, PyAny>, why: &'static str) -> NotJson {
    let type_name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".to_owned());
    NotJson { path: String::new(), type_name, why }
}

fn prefix(mut e: NotJson, segment: &str) -> NotJson {
    e.path = if e.path.is_empty() || e.path.starts_with('[') {
        format!("{segment}{}", e.path)
    } else {
        format!("{segment}.{}", e.path)
    };
    e
}

/// Converts a Python value to JSON: `None`, `bool`, `int` (64-bit), finite `float`, `str`,
/// `list`/`tuple` and `dict` with `str` keys.
pub(crate) fn to_json(obj: &Bound<'_, PyAny>) -> Result<Value, NotJson> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_instance_of::<PyString>() {
        return obj.extract::<String>().map(Value::String).map_err(|_| bad(obj, "a str that is not valid UTF-8"));
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.is_truthy().map_err(|_| bad(obj, "a bool"))?));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::Number(i.into()));
        }
        if let Ok(u) = obj.extract::<u64>() {
            return Ok(Value::Number(u.into()));
        }
        return Err(bad(obj, "an int that fits in 64 bits"));
    }
    if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract().map_err(|_| bad(obj, "a float"))?;
        return Number::from_f64(f).map(Value::Number).ok_or_else(|| bad(obj, "a finite float (JSON has no NaN/inf)"));
    }
    if let Ok(list) = obj.cast::<PyList>() {
        let mut out = Vec::with_capacity(list.len());
        for (i, item) in list.iter().enumerate() {
            out.push(to_json(&item).map_err(|e| prefix(e, &format!("[{i}]")))?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        let mut out = Vec::with_capacity(tuple.len());
        for (i, item) in tuple.iter().enumerate() {
            out.push(to_json(&item).map_err(|e| prefix(e, &format!("[{i}]")))?);
        }
        return Ok(Value::Array(out));
    }
    if let Ok(dict) = obj.cast::<PyDict>() {
        return dict_to_json(dict);
    }
    Err(bad(obj, "a JSON value (None, bool, int, float, str, list, tuple or dict with str keys)"))
}

fn dict_to_json(dict: &Bound<'_, PyDict>) -> Result<Value, NotJson> {
    let mut map = Map::new();
    for (k, v) in dict.iter() {
        let Ok(key) = k.extract::<String>() else {
            return Err(bad(&k, "a dict key of type str"));
        };
        let value = to_json(&v).map_err(|e| prefix(e, &key))?;
        map.insert(key, value);
    }
    Ok(Value::Object(map))
}

/// Binds a call's arguments to the function's positional parameter names: `{name: value}`,
/// with positionals beyond the names under `"*args"`.
pub(crate) fn bind_args(
    args: &Bound<'_, PyTuple>,
    kwargs: Option<&Bound<'_, PyDict>>,
    names: &[String],
) -> Result<Value, NotJson> {
    let mut map = Map::new();
    let mut extra = Vec::new();
    for (i, item) in args.iter().enumerate() {
        let name = names.get(i);
        let label = name.cloned().unwrap_or_else(|| format!("*args[{}]", i - names.len()));
        let v = to_json(&item).map_err(|e| prefix(e, &label))?;
        match name {
            Some(n) => {
                map.insert(n.clone(), v);
            }
            None => extra.push(v),
        }
    }
    if !extra.is_empty() {
        map.insert("*args".to_owned(), Value::Array(extra));
    }
    if let Some(kw) = kwargs {
        for (k, v) in kw.iter() {
            let Ok(key) = k.extract::<String>() else {
                return Err(bad(&k, "a keyword name of type str"));
            };
            if key == CALL_ID {
                return Err(NotJson {
                    path: key,
                    type_name: "reserved".to_owned(),
                    why: "a keyword name other than `$call_id` (Tidegate records call ids under it)",
                });
            }
            let value = to_json(&v).map_err(|e| prefix(e, &key))?;
            map.insert(key, value);
        }
    }
    Ok(Value::Object(map))
}

/// Where a call's id is recorded with its arguments (only for tools whose functions take a
/// `call_id`; see `tool.rs`). Not a valid Python identifier, so no parameter can clash.
pub(crate) const CALL_ID: &str = "$call_id";

/// The inverse of [`bind_args`]: positional arguments and keyword arguments for a call, and
/// the call id recorded with them (removed from the keyword arguments).
pub(crate) fn unbind_args<'py>(
    py: Python<'py>,
    args: &Value,
    names: &[String],
) -> PyResult<(Bound<'py, PyTuple>, Bound<'py, PyDict>, Option<String>)> {
    let kwargs = PyDict::new(py);
    let mut positional: Vec<Bound<'py, PyAny>> = Vec::new();
    let Value::Object(map) = args else {
        return Ok((PyTuple::new(py, [to_py(py, args)?])?, kwargs, None));
    };
    let call_id = map.get(CALL_ID).and_then(Value::as_str).map(str::to_owned);
    if let Some(Value::Array(extra)) = map.get("*args") {
        // Every named parameter was passed positionally.
        for n in names {
            positional.push(map.get(n).map_or_else(|| Ok(py.None().into_bound(py)), |v| to_py(py, v))?);
        }
        for v in extra {
            positional.push(to_py(py, v)?);
        }
        for (k, v) in map {
            if k != "*args" && k != CALL_ID && !names.contains(k) {
                kwargs.set_item(k, to_py(py, v)?)?;
            }
        }
    } else {
        for (k, v) in map {
            if k != CALL_ID {
                kwargs.set_item(k, to_py(py, v)?)?;
            }
        }
    }
    Ok((PyTuple::new(py, positional)?, kwargs, call_id))
}

/// Converts JSON to the natural Python value (`dict`, `list`, `str`, `int`, `float`, `bool`,
/// `None`).
pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    match v {
        Value::Null => Ok(py.None().into_bound(py)),
        Value::Bool(b) => b.into_bound_py_any(py),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_bound_py_any(py)
            } else if let Some(u) = n.as_u64() {
                u.into_bound_py_any(py)
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py)
            }
        }
        Value::String(s) => s.into_bound_py_any(py),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            Ok(list.into_any())
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, to_py(py, item)?)?;
            }
            Ok(dict.into_any())
        }
    }
}

/// A tool's output for the ledger: its JSON form, or, for objects with none, a record of
/// its type and `repr` (the live object still reaches the caller and the compensation).
pub(crate) fn output_to_json(obj: &Bound<'_, PyAny>) -> Value {
    match to_json(obj) {
        Ok(v) => v,
        Err(_) => {
            let mut map = Map::new();
            let ty = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
            let repr = obj.repr().map(|r| r.to_string()).unwrap_or_default();
            map.insert("$type".to_owned(), Value::String(ty));
            map.insert("$repr".to_owned(), Value::String(repr));
            Value::Object(map)
        }
    }
}
