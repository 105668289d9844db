//! The stdio transport toward the agent: newline-delimited JSON-RPC, with the answers the
//! protocol asks for when a line is not a message.
//!
//! * A line that is not JSON is answered `-32700` (parse error, `id: null`).
//! * JSON that is not a JSON-RPC message the server takes is answered `-32600` (invalid
//!   request), with the line's `id` when it has one.
//! * A line longer than [`MAX_MESSAGE_BYTES`] is skipped to its end without being held in
//!   memory and answered `-32600`, naming the limit.
//!
//! In every case the session goes on. Valid messages are handed to rmcp as they come.

use std::io;

use futures::{Sink, Stream};
use rmcp::RoleServer;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// The longest message read from the agent, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

fn error_line(id: Value, code: i64, message: String) -> Vec<u8> {
    let mut v = serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}))
        .unwrap_or_default();
    v.push(b'\n');
    v
}

/// What to do with one complete line.
fn decode(line: &[u8]) -> Result<RxJsonRpcMessage<RoleServer>, Vec<u8>> {
    match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line) {
        Ok(m) => Ok(m),
        Err(e) => match serde_json::from_slice::<Value>(line) {
            Err(_) => Err(error_line(Value::Null, -32700, format!("parse error: not JSON ({e})"))),
            Ok(v) => {
                let id = v.get("id").cloned().filter(|i| i.is_string() || i.is_number()).unwrap_or(Value::Null);
                Err(error_line(id, -32600, format!("invalid request: not a JSON-RPC message this server takes ({e})")))
            }
        },
    }
}

/// The transport over `input` and `output` (the process's stdin and stdout).
pub fn transport<R, W>(
    input: R,
    output: W,
) -> (
    impl Sink<TxJsonRpcMessage<RoleServer>, Error = io::Error> + Send + Unpin + 'static,
    impl Stream<Item = RxJsonRpcMessage<RoleServer>> + Send + Unpin + 'static,
)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        let mut output = output;
        while let Some(line) = out_rx.recv().await {
            if output.write_all(&line).await.is_err() || output.flush().await.is_err() {
                return;
            }
        }
    });

    let (in_tx, in_rx) = mpsc::channel::<RxJsonRpcMessage<RoleServer>>(64);
    let errors = out_tx.clone();
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        let mut line = Vec::new();
        let mut oversized = false;
        loop {
            let (done, used) = match input.fill_buf().await {
                Err(_) => return,
                Ok([]) => return, // end of input: the session ends
                Ok(buf) => match buf.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        if !oversized && line.len() + i <= MAX_MESSAGE_BYTES {
                            line.extend_from_slice(&buf[..i]);
                        } else {
                            oversized = true;
                        }
                        (true, i + 1)
                    }
                    None => {
                        if !oversized && line.len() + buf.len() <= MAX_MESSAGE_BYTES {
                            line.extend_from_slice(buf);
                        } else {
                            oversized = true;
                            line.clear();
                        }
                        (false, buf.len())
                    }
                },
            };
            input.consume(used);
            if !done {
                continue;
            }
            let reply = if oversized {
                Some(error_line(
                    Value::Null,
                    -32600,
                    format!("invalid request: a message is at most {MAX_MESSAGE_BYTES} bytes; this one was longer"),
                ))
            } else if line.iter().all(u8::is_ascii_whitespace) {
                None
            } else {
                match decode(&line) {
                    Ok(m) => {
                        if in_tx.send(m).await.is_err() {
                            return;
                        }
                        None
                    }
                    Err(e) => Some(e),
                }
            };
            if let Some(r) = reply
                && errors.send(r).await.is_err()
            {
                return;
            }
            line.clear();
            oversized = false;
        }
    });

    let sink = Box::pin(futures::sink::unfold(out_tx, |tx, msg: TxJsonRpcMessage<RoleServer>| async move {
        let mut line = serde_json::to_vec(&msg).map_err(io::Error::other)?;
        line.push(b'\n');
        tx.send(line).await.map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "stdout closed"))?;
        Ok::<_, io::Error>(tx)
    }));
    let stream = Box::pin(futures::stream::unfold(in_rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) }));
    (sink, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_that_are_not_messages_get_the_protocols_errors() {
        let e = decode(b"{not json").unwrap_err();
        let v: Value = serde_json::from_slice(&e).unwrap();
        assert_eq!((v["id"].clone(), v["error"]["code"].as_i64()), (Value::Null, Some(-32700)));
        let e = decode(br#"{"jsonrpc":"2.0","id":7,"method":42}"#).unwrap_err();
        let v: Value = serde_json::from_slice(&e).unwrap();
        assert_eq!((v["id"].as_i64(), v["error"]["code"].as_i64()), (Some(7), Some(-32600)));
        assert!(decode(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_ok());
    }
}
