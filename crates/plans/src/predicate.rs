//! The declarative trigger form (docs/plans.md, "Predicates") and its three-valued logic.

use serde::{Deserialize, Serialize};

use crate::error::PlanError;
use crate::fact::{EffectId, PlanId, Seq, TxId};

/// Most atoms in one predicate.
pub const MAX_ATOMS: usize = 32;
/// Deepest nesting of one predicate.
pub const MAX_DEPTH: usize = 8;

/// A truth value that may not be known yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tri {
    /// Holds.
    True,
    /// Not known yet.
    Unknown,
    /// Does not hold, and never will.
    False,
}

impl Tri {
    fn not(self) -> Tri {
        match self {
            Tri::True => Tri::False,
            Tri::False => Tri::True,
            Tri::Unknown => Tri::Unknown,
        }
    }
}

/// "Effect `effect` of transaction `tx` settled with tag `tag`."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tagged {
    /// Tenant (default: the executor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Transaction.
    pub tx: TxId,
    /// Effect.
    pub effect: EffectId,
    /// Tag (`clean`, `unresolved`, `leaked`, `partial-commit`).
    pub tag: String,
}

/// "A compensation of plan `plan` (of registration `seq`) was confirmed done."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compensated {
    /// Tenant (default: the executor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The plan.
    pub plan: PlanId,
    /// One registration, or any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<Seq>,
}

/// "No committed transaction wrote `scope` before `before_ms`."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoCommit {
    /// Tenant (default: the executor's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Canonical scope, compared exactly.
    pub scope: String,
    /// Engine clock, milliseconds.
    pub before_ms: u64,
}

/// A trigger predicate over ledger facts of one tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Predicate {
    /// See [`Tagged`].
    Tagged(Tagged),
    /// See [`Compensated`].
    Compensated(Compensated),
    /// See [`NoCommit`].
    NoCommit(NoCommit),
    /// Kleene conjunction.
    All(Vec<Predicate>),
    /// Kleene disjunction.
    Any(Vec<Predicate>),
    /// Negation (true and false swap).
    Not(Box<Predicate>),
}

/// One atom of a compiled predicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Atom {
    Tagged { tx: TxId, effect: EffectId, tag: String },
    Compensated { plan: PlanId, seq: Option<Seq> },
    NoCommit { scope: String, before_ms: u64 },
}

/// A predicate's tree over atom slots `0..n`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Node {
    Atom(usize),
    All(Vec<Node>),
    Any(Vec<Node>),
    Not(Box<Node>),
}

impl Node {
    /// Whether every atom the tree names is below `n` (a decoded snapshot is checked).
    pub(crate) fn atoms_below(&self, n: usize) -> bool {
        match self {
            Node::Atom(i) => *i < n,
            Node::All(v) | Node::Any(v) => v.iter().all(|c| c.atoms_below(n)),
            Node::Not(c) => c.atoms_below(n),
        }
    }

    pub(crate) fn eval(&self, atoms: &[Tri]) -> Tri {
        match self {
            Node::Atom(i) => atoms.get(*i).copied().unwrap_or(Tri::Unknown),
            Node::All(v) => {
                let mut out = Tri::True;
                for n in v {
                    match n.eval(atoms) {
                        Tri::False => return Tri::False,
                        Tri::Unknown => out = Tri::Unknown,
                        Tri::True => {}
                    }
                }
                out
            }
            Node::Any(v) => {
                let mut out = Tri::False;
                for n in v {
                    match n.eval(atoms) {
                        Tri::True => return Tri::True,
                        Tri::Unknown => out = Tri::Unknown,
                        Tri::False => {}
                    }
                }
                out
            }
            Node::Not(n) => n.eval(atoms).not(),
        }
    }
}

impl Predicate {
    /// Checks size, depth and tenant, and returns the atoms and the tree over them.
    pub(crate) fn compile(&self, tenant: &str) -> Result<(Vec<Atom>, Node), PlanError> {
        let mut atoms = Vec::new();
        let node = self.walk(tenant, 0, &mut atoms)?;
        Ok((atoms, node))
    }

    fn walk(&self, tenant: &str, depth: usize, atoms: &mut Vec<Atom>) -> Result<Node, PlanError> {
        if depth >= MAX_DEPTH {
            return Err(PlanError::invalid(
                "predicate",
                format!("nesting deeper than {depth}"),
                format!("at most {MAX_DEPTH} levels"),
            ));
        }
        let check = |t: &Option<String>, field: &str| match t {
            Some(t) if t != tenant => {
                Err(PlanError::CrossTenant { field: field.into(), found: t.clone(), tenant: tenant.into() })
            }
            _ => Ok(()),
        };
        let atom = match self {
            Predicate::Tagged(a) => {
                check(&a.tenant, "predicate.tagged.tenant")?;
                if a.tag.is_empty() {
                    return Err(PlanError::invalid("predicate.tagged.tag", "\"\"", "a tag name"));
                }
                Atom::Tagged { tx: a.tx, effect: a.effect, tag: a.tag.clone() }
            }
            Predicate::Compensated(a) => {
                check(&a.tenant, "predicate.compensated.tenant")?;
                Atom::Compensated { plan: a.plan, seq: a.seq }
            }
            Predicate::NoCommit(a) => {
                check(&a.tenant, "predicate.no_commit.tenant")?;
                if a.scope.is_empty() {
                    return Err(PlanError::invalid("predicate.no_commit.scope", "\"\"", "a canonical scope"));
                }
                Atom::NoCommit { scope: a.scope.clone(), before_ms: a.before_ms }
            }
            Predicate::All(v) | Predicate::Any(v) => {
                if v.is_empty() {
                    return Err(PlanError::invalid(
                        "predicate",
                        "an empty list",
                        "at least one predicate in `all`/`any`",
                    ));
                }
                let nodes = v.iter().map(|p| p.walk(tenant, depth + 1, atoms)).collect::<Result<Vec<_>, _>>()?;
                return Ok(if matches!(self, Predicate::All(_)) { Node::All(nodes) } else { Node::Any(nodes) });
            }
            Predicate::Not(p) => return Ok(Node::Not(Box::new(p.walk(tenant, depth + 1, atoms)?))),
        };
        if atoms.len() >= MAX_ATOMS {
            return Err(PlanError::invalid(
                "predicate",
                format!("more than {MAX_ATOMS} atoms"),
                format!("at most {MAX_ATOMS} atoms"),
            ));
        }
        atoms.push(atom);
        Ok(Node::Atom(atoms.len() - 1))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn kleene_logic() {
        let p: Predicate = serde_json::from_str(
            r#"{"any":[{"tagged":{"tx":1,"effect":0,"tag":"leaked"}},{"not":{"no_commit":{"scope":"a:b","before_ms":5}}}]}"#,
        )
        .unwrap();
        let (atoms, node) = p.compile("t").unwrap();
        assert_eq!(atoms.len(), 2);
        assert_eq!(node.eval(&[Tri::Unknown, Tri::Unknown]), Tri::Unknown);
        assert_eq!(node.eval(&[Tri::False, Tri::True]), Tri::False);
        assert_eq!(node.eval(&[Tri::Unknown, Tri::False]), Tri::True);
        assert_eq!(node.eval(&[Tri::True, Tri::True]), Tri::True);
    }

    #[test]
    fn another_tenant_is_refused_naming_the_field() {
        let p: Predicate = serde_json::from_str(r#"{"all":[{"compensated":{"plan":1,"tenant":"other"}}]}"#).unwrap();
        let e = p.compile("mine").unwrap_err();
        assert!(
            matches!(&e, PlanError::CrossTenant { field, found, tenant }
                if field == "predicate.compensated.tenant" && found == "other" && tenant == "mine"),
            "{e:?}"
        );
    }

    #[test]
    fn too_many_atoms_is_refused() {
        let atom = Predicate::Compensated(Compensated { tenant: None, plan: 1, seq: None });
        let p = Predicate::All(vec![atom; MAX_ATOMS + 1]);
        assert!(matches!(p.compile("t"), Err(PlanError::Invalid { .. })));
    }
}
