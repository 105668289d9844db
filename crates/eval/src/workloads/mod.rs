//! The workloads. Each builds task bodies once and runs them under every mode it compares,
//! then counts outcomes from the sinks.

pub mod annotations;
pub mod contention;
pub mod irreversible;
pub mod recovery;
pub mod speculation;
pub mod stress;

use std::sync::Arc;

use serde_json::json;
use tidegate_runtime::EffectClass;

use crate::mech::{Abort, Attempt, Body};
use crate::sinks::SinkKind;
use crate::world::ToolSpec;

/// Order operations (cancel, modify, ship), staged until commit where the mechanism can.
pub const ORDER_OP: ToolSpec = ToolSpec::orders("order_op", EffectClass::Bufferable);
/// The customer confirmation: an irreversible mail.
pub const SEND_MAIL: ToolSpec = ToolSpec::sink("send_mail", SinkKind::Mail, EffectClass::Gated);
/// A stock reservation row (reversible: the row is deleted on undo).
pub const RESERVE_ROW: ToolSpec = ToolSpec::sink("reserve_stock", SinkKind::Db, EffectClass::Reversible);
/// A payment-ledger file entry (reversible).
pub const CHARGE_FILE: ToolSpec = ToolSpec::sink("charge_card", SinkKind::Fs, EffectClass::Reversible);
/// A note in the buffer (bufferable).
pub const NOTE_BUFFER: ToolSpec = ToolSpec::sink("write_note", SinkKind::Buffer, EffectClass::Bufferable);

/// The read → plan pause → write body of the retail workloads: read the order, think, and if
/// it is still pending apply `op` planned on the version read (and, with `confirm`, mail the
/// customer). `res` names this agent's effects.
pub fn order_body(order: String, op: &'static str, think_ms: u64, res: String, confirm: bool) -> Body {
    Arc::new(move |a: Arc<dyn Attempt>, _attempt| {
        let (order, res) = (order.clone(), res.clone());
        Box::pin(async move {
            let scope = format!("retail:order:{order}");
            let seen = a.read(&scope).await?;
            crate::think(think_ms).await;
            if seen.status != "pending" {
                return Ok::<(), Abort>(());
            }
            a.call(&ORDER_OP, json!({"order": order, "op": op, "based_on": seen.version, "res": format!("{res}:op")}))
                .await?;
            if confirm {
                a.call(&SEND_MAIL, json!({"res": format!("{res}:mail"), "body": {"order": order, "op": op}})).await?;
            }
            Ok(())
        })
    })
}
