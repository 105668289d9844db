//! The transaction manager: requests, reviews, the dependency graph, materialisation and the
//! removal cascade, on one database, with every fact in a decision log.
//!
//! Live operations and the rebuild after a restart run the same [`State::apply`]; live, the
//! actions it returns (execute, compensate) are carried out on the database and their outcome
//! is logged and applied in turn; on rebuild they are not (their outcome records follow in
//! the log), and an action whose outcome was not logged is settled from the database's marker
//! table.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::db::Database;
use crate::deps::{Checker, EdgeKind, Granularity, Item, Side, Touch, predicted_compensation, request_touches};
use crate::error::{Error, Result};
use crate::exec::{self, Compensation, ExecFailure};
use crate::log::{Decision, DecisionLog, Record};
use crate::template::{Strategy, TemplateSet};

/// A request for a transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The template's name.
    pub template: String,
    /// Its parameters (a JSON object).
    pub params: serde_json::Value,
    /// Who sent it (a user, an LLM agent).
    pub sender: String,
    /// Whether it needs review (LLM-generated, flagged by a policy, chosen by rule).
    pub suspicious: bool,
}

/// Manager options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    /// The deployment's strategy (a template may override it). Default: buffer suspicious.
    pub strategy: Strategy,
    /// The finest granularity of dependency checks. Default: field.
    pub granularity: Granularity,
}

impl Default for Options {
    fn default() -> Self {
        Options { strategy: Strategy::BufferSuspicious, granularity: Granularity::Field }
    }
}

/// Where a transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for buffered transactions it depends on.
    Held,
    /// Suspicious, not executed, waiting for a reviewer.
    AwaitingReview,
    /// Executed; its compensation is held until a reviewer decides.
    ExecutedAwaitingReview,
    /// Final: in the database for good.
    Committed,
    /// Final: taken out of history (never executed, or compensated).
    Removed,
    /// Final: the database refused it (rolled back).
    Failed,
    /// Final: a removal whose compensation the database refused (the effect stays).
    CompensationFailed,
}

impl Status {
    /// Whether the status is final.
    pub fn is_final(self) -> bool {
        matches!(self, Status::Committed | Status::Removed | Status::Failed | Status::CompensationFailed)
    }
}

/// What a status query returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TxView {
    /// Transaction id.
    pub id: u64,
    /// Template name.
    pub template: String,
    /// Parameters.
    pub params: serde_json::Value,
    /// Sender.
    pub sender: String,
    /// Whether it needs review.
    pub suspicious: bool,
    /// Where it stands.
    pub status: Status,
    /// The reviewer's decision, if any.
    pub review: Option<Decision>,
    /// Buffered transactions it waits for.
    pub waits_for: Vec<u64>,
    /// Transactions waiting for it.
    pub waited_by: Vec<u64>,
    /// The removal it was cascaded from, if any.
    pub cascaded_from: Option<u64>,
    /// The database's refusal, if any.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Executing,
    Executed,
    Compensating,
}

#[derive(Debug, Clone)]
struct Tx {
    id: u64,
    template: String,
    params: serde_json::Value,
    sender: String,
    suspicious: bool,
    strategy: Strategy,
    touches: Vec<Touch>,
    waits_on: BTreeMap<u64, EdgeKind>,
    review: Option<Decision>,
    phase: Phase,
    compensation: Option<Compensation>,
}

/// Something the state asks the driver to do on the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Execute transaction `id`.
    Execute(u64),
    /// Run the compensation of transaction `id`.
    Compensate(u64),
}

/// Counters over a manager's life (since it was opened).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Requests received.
    pub requests: u64,
    /// Requests buffered on arrival (suspicious under buffer-suspicious, or held).
    pub buffered_on_arrival: u64,
    /// Requests held on arrival because of a dependency.
    pub held_on_arrival: u64,
    /// Database executions (including refused ones).
    pub executions: u64,
    /// Executions the database refused.
    pub failed: u64,
    /// Compensations run.
    pub compensations: u64,
    /// Removals whose compensation the database refused (must stay 0).
    pub refused_removals: u64,
    /// Transactions removed by a cascade.
    pub cascaded: u64,
}

/// The manager's state: a projection of the decision log.
#[derive(Debug, Default)]
pub struct State {
    active: BTreeMap<u64, Tx>,
    done: BTreeMap<u64, (Tx, Status, Option<u64>, Option<String>)>,
    next_id: u64,
    /// Counters.
    pub stats: Stats,
}

impl State {
    /// The buffered item of `tx`: `(touches, what they are)`, one or two parts.
    fn items(tx: &Tx) -> Vec<(std::borrow::Cow<'_, [Touch]>, Item)> {
        use std::borrow::Cow;
        match (&tx.phase, &tx.compensation) {
            (Phase::Executed | Phase::Compensating, Some(Compensation::Derived { touches, .. })) => {
                vec![(Cow::Borrowed(touches.as_slice()), Item::Compensation)]
            }
            (Phase::Executed | Phase::Compensating, _) => {
                vec![(Cow::Owned(predicted_compensation(&tx.touches)), Item::Compensation)]
            }
            _ if tx.suspicious && tx.strategy == Strategy::BufferCompensating && tx.review.is_none() => {
                // Not executed yet, but it will be, and then its compensation is buffered: a
                // transaction released after it must respect both (regression: a held Delivery
                // released right after a held suspicious New-Order delivered that order, and
                // the New-Order's removal then found its new_order row gone).
                vec![
                    (Cow::Borrowed(tx.touches.as_slice()), Item::Writes),
                    (Cow::Owned(predicted_compensation(&tx.touches)), Item::Compensation),
                ]
            }
            _ => vec![(Cow::Borrowed(tx.touches.as_slice()), Item::Writes)],
        }
    }

    /// Whether `tx` will execute once its edges are resolved, whatever a reviewer does (it
    /// needs no review, or was accepted): the order of its writes against a newcomer's is
    /// fixed by arrival.
    fn will_run(tx: &Tx) -> bool {
        tx.phase == Phase::Pending
            && (!(tx.suspicious && tx.strategy == Strategy::BufferSuspicious) || tx.review == Some(Decision::Accept))
    }

    /// The edges a new transaction would get against the buffer. `checker` works at the
    /// configured granularity; a `builds_on` edge it finds is kept only when `fine` (field
    /// granularity, the values known) finds it too, so a removal cascades only to what
    /// presupposes its effect (issue 27 item 4); otherwise the edge is `waits`.
    fn edges(
        &self,
        checker: &Checker,
        fine: &Checker,
        template: &str,
        params: &serde_json::Value,
        touches: &[Touch],
        will_compensate: bool,
    ) -> BTreeMap<u64, EdgeKind> {
        let mut out = BTreeMap::new();
        if touches.is_empty() {
            return out;
        }
        let predicted = if will_compensate { predicted_compensation(touches) } else { Vec::new() };
        let n = Side { template, params, touches };
        for b in self.active.values() {
            let mut k: Option<EdgeKind> = None;
            for (item, what) in Self::items(b) {
                let bs = Side { template: &b.template, params: &b.params, touches: &item };
                let mut found = checker.depends_on(bs, what, n);
                if found == Some(EdgeKind::BuildsOn) && fine.depends_on(bs, what, n) != Some(EdgeKind::BuildsOn) {
                    found = Some(EdgeKind::Waits);
                }
                k = k.max(found);
            }
            if Self::will_run(b) && checker.overlaps(&b.touches, touches) {
                // Held behind a held transaction it conflicts with: arrival order decides
                // both outcomes (issue 27 item 5).
                k = k.max(Some(EdgeKind::Waits));
            }
            if will_compensate && matches!(b.phase, Phase::Pending) {
                // The new transaction executes now and may be compensated later, after `b`
                // has executed: `b`'s writes must not break that compensation.
                let mine = Side { template, params, touches: &predicted };
                let theirs = Side { template: &b.template, params: &b.params, touches: &b.touches };
                if checker.depends_on(mine, Item::Compensation, theirs).is_some() {
                    k = k.max(Some(EdgeKind::Waits));
                }
            }
            if let Some(k) = k {
                out.insert(b.id, k);
            }
        }
        out
    }

    /// Applies one record; returns the database actions it calls for.
    pub fn apply(&mut self, rec: &Record) -> Vec<Action> {
        let mut actions = Vec::new();
        match rec {
            Record::Request { id, template, params, sender, suspicious, strategy, touches, waits_on } => {
                self.next_id = self.next_id.max(id + 1);
                self.stats.requests += 1;
                let live: BTreeMap<u64, EdgeKind> =
                    waits_on.iter().filter(|(d, _)| self.active.contains_key(d)).map(|(d, k)| (*d, *k)).collect();
                if !live.is_empty() {
                    self.stats.held_on_arrival += 1;
                }
                if !live.is_empty() || (*suspicious && *strategy == Strategy::BufferSuspicious) {
                    self.stats.buffered_on_arrival += 1;
                }
                self.active.insert(
                    *id,
                    Tx {
                        id: *id,
                        template: template.clone(),
                        params: params.clone(),
                        sender: sender.clone(),
                        suspicious: *suspicious,
                        strategy: *strategy,
                        touches: touches.clone(),
                        waits_on: live,
                        review: None,
                        phase: Phase::Pending,
                        compensation: None,
                    },
                );
            }
            Record::Review { id, decision, .. } => {
                if let Some(tx) = self.active.get_mut(id) {
                    tx.review = Some(*decision);
                    match (decision, tx.phase) {
                        (Decision::Remove, Phase::Pending) => self.finish(*id, Status::Removed, None, None),
                        (Decision::Remove, Phase::Executed) => {
                            tx.phase = Phase::Compensating;
                            actions.push(Action::Compensate(*id));
                        }
                        (Decision::Accept, Phase::Executed) => self.finish(*id, Status::Committed, None, None),
                        _ => {}
                    }
                }
            }
            Record::Executed { id, error, compensation } => {
                self.stats.executions += 1;
                if let Some(tx) = self.active.get_mut(id) {
                    match error {
                        Some(e) => {
                            self.stats.failed += 1;
                            self.finish(*id, Status::Failed, None, Some(e.clone()));
                        }
                        None => {
                            let keep = tx.suspicious && tx.strategy == Strategy::BufferCompensating;
                            match (keep, tx.review) {
                                (true, None) => {
                                    tx.phase = Phase::Executed;
                                    tx.compensation = compensation.clone();
                                }
                                (true, Some(Decision::Remove)) => {
                                    tx.phase = Phase::Compensating;
                                    tx.compensation = compensation.clone();
                                    actions.push(Action::Compensate(*id));
                                }
                                _ => self.finish(*id, Status::Committed, None, None),
                            }
                        }
                    }
                }
            }
            // Templates are the manager's, not the state's.
            Record::Templates { .. } => {}
            Record::Compensated { id, error } => {
                self.stats.compensations += 1;
                match error {
                    None => self.finish(*id, Status::Removed, None, None),
                    Some(e) => {
                        self.stats.refused_removals += 1;
                        self.finish(*id, Status::CompensationFailed, None, Some(e.clone()));
                    }
                }
            }
        }
        self.materialise(&mut actions);
        actions
    }

    /// Makes `id` final; a removal or failure removes the transactions that build on it.
    fn finish(&mut self, id: u64, status: Status, cascaded_from: Option<u64>, error: Option<String>) {
        let Some(tx) = self.active.remove(&id) else { return };
        self.done.insert(id, (tx, status, cascaded_from, error));
        if matches!(status, Status::Removed | Status::Failed) {
            let dependents: Vec<u64> = self
                .active
                .values()
                .filter(|t| t.phase == Phase::Pending && t.waits_on.get(&id) == Some(&EdgeKind::BuildsOn))
                .map(|t| t.id)
                .collect();
            for d in dependents {
                self.stats.cascaded += 1;
                self.finish(d, Status::Removed, Some(id), None);
            }
        }
    }

    /// The document's `check_for_materialization`: releases, in id order, every pending
    /// transaction whose dependencies are resolved and that needs no (more) review.
    ///
    /// One transaction is released at a time, the oldest ready one, and the next only once its
    /// outcome is applied: a transaction that becomes ready when an older one finishes still
    /// runs before younger ones (held transactions keep their arrival order, invariant 4;
    /// issue 27 item 5).
    fn materialise(&mut self, actions: &mut Vec<Action>) {
        let active: BTreeSet<u64> = self.active.keys().copied().collect();
        for tx in self.active.values_mut().filter(|t| t.phase == Phase::Pending) {
            tx.waits_on.retain(|d, _| active.contains(d));
        }
        if self.active.values().any(|t| t.phase == Phase::Executing) {
            return;
        }
        for tx in self.active.values_mut() {
            if tx.phase != Phase::Pending || !tx.waits_on.is_empty() {
                continue;
            }
            let ready =
                !(tx.suspicious && tx.strategy == Strategy::BufferSuspicious) || tx.review == Some(Decision::Accept);
            if ready {
                tx.phase = Phase::Executing;
                actions.push(Action::Execute(tx.id));
                return;
            }
        }
    }

    fn view(&self, id: u64) -> Option<TxView> {
        let waited_by = |id: u64| self.active.values().filter(|t| t.waits_on.contains_key(&id)).map(|t| t.id).collect();
        if let Some(tx) = self.active.get(&id) {
            let status = match tx.phase {
                Phase::Pending | Phase::Executing if !tx.waits_on.is_empty() => Status::Held,
                Phase::Pending | Phase::Executing => Status::AwaitingReview,
                Phase::Executed | Phase::Compensating => Status::ExecutedAwaitingReview,
            };
            return Some(TxView {
                id,
                template: tx.template.clone(),
                params: tx.params.clone(),
                sender: tx.sender.clone(),
                suspicious: tx.suspicious,
                status,
                review: tx.review,
                waits_for: tx.waits_on.keys().copied().collect(),
                waited_by: waited_by(id),
                cascaded_from: None,
                error: None,
            });
        }
        let (tx, status, cascaded_from, error) = self.done.get(&id)?;
        Some(TxView {
            id,
            template: tx.template.clone(),
            params: tx.params.clone(),
            sender: tx.sender.clone(),
            suspicious: tx.suspicious,
            status: *status,
            review: tx.review,
            waits_for: Vec::new(),
            waited_by: Vec::new(),
            cascaded_from: *cascaded_from,
            error: error.clone(),
        })
    }

    /// Checks the graph against the statuses; returns the first inconsistency.
    pub fn check_integrity(&self) -> std::result::Result<(), String> {
        for tx in self.active.values() {
            for d in tx.waits_on.keys() {
                if *d >= tx.id {
                    return Err(format!("tx {} waits for a later transaction {d}", tx.id));
                }
                if !self.active.contains_key(d) && tx.phase == Phase::Pending {
                    return Err(format!("tx {} waits for resolved transaction {d}", tx.id));
                }
            }
            match tx.phase {
                Phase::Executing | Phase::Compensating => return Err(format!("tx {} has an unsettled action", tx.id)),
                Phase::Executed => {
                    if !(tx.suspicious && tx.strategy == Strategy::BufferCompensating && tx.review.is_none()) {
                        return Err(format!("tx {} is executed and buffered without reason", tx.id));
                    }
                    if !tx.waits_on.is_empty() {
                        return Err(format!("tx {} executed while waiting", tx.id));
                    }
                }
                Phase::Pending => {
                    let ready = !(tx.suspicious && tx.strategy == Strategy::BufferSuspicious)
                        || tx.review == Some(Decision::Accept);
                    if tx.waits_on.is_empty() && ready {
                        return Err(format!("tx {} is ready but not materialised", tx.id));
                    }
                }
            }
            if self.done.contains_key(&tx.id) {
                return Err(format!("tx {} is both active and final", tx.id));
            }
        }
        Ok(())
    }
}

/// The review middleware over one database.
pub struct Manager {
    set: TemplateSet,
    options: Options,
    checker: Checker,
    /// The same invariants at field granularity: decides whether a `builds_on` edge is kept.
    fine: Checker,
    db: Box<dyn Database>,
    log: Box<dyn DecisionLog>,
    state: State,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").field("options", &self.options).field("state", &self.state).finish()
    }
}

impl Manager {
    /// Opens a manager: validates the templates, creates the marker table, rebuilds the state
    /// from the log and settles any action a crash left without an outcome.
    pub fn open(
        set: TemplateSet,
        mut db: Box<dyn Database>,
        log: Box<dyn DecisionLog>,
        options: Options,
    ) -> Result<Manager> {
        let mut set = set;
        let mut state = State::default();
        for rec in log.read_all()? {
            match rec {
                // Templates registered while running come back in log order (their schema
                // already ran on the database).
                Record::Templates { set: more, .. } => {
                    set.merge(more)?;
                }
                rec => {
                    let _replayed_actions = state.apply(&rec);
                }
            }
        }
        set.validate()?;
        exec::install_marker_table(db.as_mut())?;
        let checker = Checker::new(&set, options.granularity);
        let fine = Checker::new(&set, Granularity::Field);
        let mut m = Manager { set, options, checker, fine, db, log, state };
        m.settle()?;
        Ok(m)
    }

    /// The templates.
    pub fn templates(&self) -> &TemplateSet {
        &self.set
    }

    /// Adds templates (with their tables and invariants) to the running manager, after running
    /// `schema` (an SQL batch, e.g. `CREATE TABLE IF NOT EXISTS ...`) on the database, and
    /// records both in the log so a rebuild has them. A template or table already registered
    /// must be given unchanged. Returns whether anything was added (registering the same set
    /// twice is a no-op, though its schema runs again).
    pub fn register(&mut self, more: TemplateSet, schema: Option<String>) -> Result<bool> {
        let mut merged = self.set.clone();
        let changed = merged.merge(more.clone())?;
        merged.validate()?;
        if let Some(sql) = &schema {
            self.db.batch(sql)?;
        }
        if changed || schema.is_some() {
            self.log.append(&Record::Templates { set: more, schema })?;
        }
        if changed {
            self.set = merged;
            self.checker = Checker::new(&self.set, self.options.granularity);
            self.fine = Checker::new(&self.set, Granularity::Field);
        }
        Ok(changed)
    }

    /// The options the manager runs with.
    pub fn options(&self) -> Options {
        self.options
    }

    /// Every non-final transaction (the buffer), oldest first.
    pub fn queue(&self) -> Vec<TxView> {
        self.state.active.keys().filter_map(|id| self.state.view(*id)).collect()
    }

    /// The transactions a removal of `id` would take with it now (its cascade: everything
    /// not yet executed that builds on it, transitively), in id order. Empty for an unknown
    /// or final id.
    pub fn cascade_preview(&self, id: u64) -> Vec<u64> {
        let mut out = BTreeSet::new();
        let mut todo = vec![id];
        while let Some(x) = todo.pop() {
            for t in self.state.active.values() {
                if t.phase == Phase::Pending && t.waits_on.get(&x) == Some(&EdgeKind::BuildsOn) && out.insert(t.id) {
                    todo.push(t.id);
                }
            }
        }
        out.into_iter().collect()
    }

    /// The transactions removed because `id` was removed (or failed), transitively, in id
    /// order.
    pub fn cascaded(&self, id: u64) -> Vec<u64> {
        let mut out = BTreeSet::new();
        let mut todo = vec![id];
        while let Some(x) = todo.pop() {
            for (d, (_, _, from, _)) in &self.state.done {
                if *from == Some(x) && out.insert(*d) {
                    todo.push(*d);
                }
            }
        }
        out.into_iter().collect()
    }

    /// The database (for reading state in tests and checks; do not write through it).
    pub fn database(&mut self) -> &mut dyn Database {
        self.db.as_mut()
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.state.stats
    }

    /// Checks the dependency graph against the statuses.
    pub fn check_integrity(&self) -> std::result::Result<(), String> {
        self.state.check_integrity()
    }

    /// Ids of the transactions a reviewer may decide on, oldest first.
    pub fn reviewable(&self) -> Vec<u64> {
        self.state.active.values().filter(|t| t.suspicious && t.review.is_none()).map(|t| t.id).collect()
    }

    /// Ids of every non-final transaction, oldest first.
    pub fn buffered(&self) -> Vec<u64> {
        self.state.active.keys().copied().collect()
    }

    /// A transaction's status.
    pub fn status(&self, id: u64) -> Result<TxView> {
        self.state.view(id).ok_or(Error::UnknownTx(id))
    }

    /// Submits a request; returns its transaction id. A non-suspicious request with no
    /// dependency is executed before this returns.
    pub fn request(&mut self, req: Request) -> Result<u64> {
        self.settle()?;
        let t = self.set.get(&req.template).ok_or_else(|| Error::UnknownTemplate(req.template.clone()))?;
        check_params(t, &req.params)?;
        let strategy = t.strategy.unwrap_or(self.options.strategy);
        let touches = request_touches(t, &req.params);
        let will_compensate = req.suspicious && strategy == Strategy::BufferCompensating;
        let waits_on =
            self.state.edges(&self.checker, &self.fine, &req.template, &req.params, &touches, will_compensate);
        let id = self.state.next_id.max(1);
        let rec = Record::Request {
            id,
            template: req.template,
            params: req.params,
            sender: req.sender,
            suspicious: req.suspicious,
            strategy,
            touches,
            waits_on: waits_on.into_iter().collect(),
        };
        self.drive(rec)?;
        Ok(id)
    }

    /// Records a reviewer's decision and carries out what follows (execution, compensation,
    /// cascade, materialisation of what waited).
    pub fn review(&mut self, id: u64, decision: Decision, reviewer: &str) -> Result<Status> {
        self.settle()?;
        let Some(tx) = self.state.active.get(&id) else {
            return Err(match self.state.done.get(&id) {
                Some((_, s, _, _)) => Error::Review { id, reason: format!("it is already final ({s:?})") },
                None => Error::UnknownTx(id),
            });
        };
        if !tx.suspicious {
            return Err(Error::Review {
                id,
                reason: "it is not suspicious; only suspicious transactions are reviewed".into(),
            });
        }
        if let Some(d) = tx.review {
            return Err(Error::Review { id, reason: format!("it was already reviewed ({d:?})") });
        }
        self.drive(Record::Review { id, decision, reviewer: reviewer.to_owned() })?;
        Ok(self.status(id)?.status)
    }

    fn drive(&mut self, first: Record) -> Result<()> {
        let mut queue = VecDeque::from([first]);
        while let Some(rec) = queue.pop_front() {
            self.log.append(&rec)?;
            for a in self.state.apply(&rec) {
                queue.push_back(self.run(a)?);
            }
        }
        Ok(())
    }

    fn run(&mut self, a: Action) -> Result<Record> {
        match a {
            Action::Execute(id) => {
                let tx = self.state.active.get(&id).ok_or(Error::UnknownTx(id))?;
                let t = self.set.get(&tx.template).ok_or_else(|| Error::UnknownTemplate(tx.template.clone()))?;
                let keep = tx.suspicious && tx.strategy == Strategy::BufferCompensating && tx.review.is_none();
                match exec::execute(self.db.as_mut(), &self.set, t, &tx.params, id, keep) {
                    Ok(compensation) => Ok(Record::Executed { id, error: None, compensation }),
                    Err(ExecFailure::Refused(e)) => Ok(Record::Executed { id, error: Some(e), compensation: None }),
                    Err(ExecFailure::Error(e)) => Err(e),
                }
            }
            Action::Compensate(id) => {
                let tx = self.state.active.get(&id).ok_or(Error::UnknownTx(id))?;
                let t = self.set.get(&tx.template).ok_or_else(|| Error::UnknownTemplate(tx.template.clone()))?;
                let comp = tx
                    .compensation
                    .clone()
                    .ok_or_else(|| Error::Review { id, reason: "no compensation was recorded".into() })?;
                match exec::compensate(self.db.as_mut(), t, &tx.params, &comp, id) {
                    Ok(()) => Ok(Record::Compensated { id, error: None }),
                    Err(ExecFailure::Refused(e)) => Ok(Record::Compensated { id, error: Some(e) }),
                    Err(ExecFailure::Error(e)) => Err(e),
                }
            }
        }
    }

    /// Carries out actions left without an outcome (by a crash or a retryable error), using
    /// the marker table so nothing is executed twice.
    fn settle(&mut self) -> Result<()> {
        let pending: Vec<(u64, Phase)> = self
            .state
            .active
            .values()
            .filter(|t| matches!(t.phase, Phase::Executing | Phase::Compensating))
            .map(|t| (t.id, t.phase))
            .collect();
        for (id, phase) in pending {
            let marker = exec::read_marker(self.db.as_mut(), id)?;
            let rec = match (phase, marker) {
                (Phase::Executing, Some((_, compensation))) => Record::Executed { id, error: None, compensation },
                (Phase::Executing, None) => self.run(Action::Execute(id))?,
                (Phase::Compensating, Some((p, _))) if p == "compensated" => Record::Compensated { id, error: None },
                (Phase::Compensating, _) => self.run(Action::Compensate(id))?,
                _ => continue,
            };
            self.drive(rec)?;
        }
        Ok(())
    }
}

fn check_params(t: &crate::template::Template, params: &serde_json::Value) -> Result<()> {
    let err = |field: &str, value: String, expected: String| Error::Param {
        template: t.name.clone(),
        field: field.to_owned(),
        value,
        expected,
    };
    let Some(obj) = params.as_object() else {
        return Err(err("params", params.to_string(), "a JSON object".into()));
    };
    let typed = |name: &str, v: &serde_json::Value| -> Result<()> {
        match t.types.get(name) {
            Some(ty) if !ty.admits(v) => Err(err(name, v.to_string(), format!("{} (declared {ty:?})", ty.describe()))),
            _ => Ok(()),
        }
    };
    for p in &t.params {
        match obj.get(p) {
            None => return Err(err(p, "missing".into(), "a value".into())),
            Some(v) if crate::value::SqlValue::from_json(v).is_none() => {
                return Err(err(p, v.to_string(), "a number, string, bool or null".into()));
            }
            Some(v) => typed(p, v)?,
        }
    }
    for (l, fields) in &t.lists {
        let Some(arr) = obj.get(l).and_then(|v| v.as_array()) else {
            return Err(err(l, obj.get(l).map_or("missing".into(), |v| v.to_string()), "an array of objects".into()));
        };
        for (i, e) in arr.iter().enumerate() {
            for f in fields {
                match e.get(f) {
                    Some(v) if crate::value::SqlValue::from_json(v).is_some() => {
                        if let Some(ty) = t.types.get(&format!("{l}.{f}"))
                            && !ty.admits(v)
                        {
                            return Err(err(
                                &format!("{l}[{i}].{f}"),
                                v.to_string(),
                                format!("{} (declared {ty:?})", ty.describe()),
                            ));
                        }
                    }
                    other => {
                        return Err(err(
                            &format!("{l}[{i}].{f}"),
                            other.map_or("missing".into(), |v| v.to_string()),
                            "a scalar value".into(),
                        ));
                    }
                }
            }
        }
    }
    for k in obj.keys() {
        if !t.params.contains(k) && !t.lists.contains_key(k) {
            return Err(err(k, obj[k].to_string(), format!("one of the template's parameters {:?}", t.params)));
        }
    }
    Ok(())
}
