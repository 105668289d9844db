// The operator console (docs/console.md): one page, hash routes, plain DOM, no dependencies.
// Signs in with an API key kept in this tab's sessionStorage and sent as a Bearer token; the
// server limits every answer to the key's tenant and role, and the page hides what the role
// cannot do. The live view reads GET /v1/transactions/stream (server-sent events read with
// fetch, since EventSource cannot send the key).
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "tidegate.console.key";
  let key = sessionStorage.getItem(KEY) || "";
  let me = null; // {tenant, role, key_id}
  let stopView = null; // cleanup of the current view (streams, timers)
  const signinSection = $("signin"); // kept while a view replaces it
  // The live view's first render, measured by the browser test: from the view's start (the
  // route) to the rows in the DOM, and to the frame that painted them.
  const perf = { liveFirstRenderMs: null, liveFirstPaintMs: null, liveRows: 0 };
  window.__tidegateConsole = perf;

  // ---- permissions (docs/server.md "Roles and permissions") -------------------------------
  const can = {
    ledger: () => me && ["reviewer", "operator", "admin"].includes(me.role),
    review: () => me && ["reviewer", "admin"].includes(me.role),
    resolve: () => me && ["operator", "admin"].includes(me.role),
    abort: () => me && ["agent", "operator", "admin"].includes(me.role),
    // Resolving a stuck plan (`POST /v1/plans/{plan}/resolve`) needs plans.resolve: its owner
    // (agent) or an operator from the owner-intervention queue.
    plan: () => me && ["agent", "operator", "admin"].includes(me.role),
  };

  // ---- small DOM helpers -------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") e.className = v;
        else if (k === "text") e.textContent = v;
        else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
        else if (k === "dataset") Object.assign(e.dataset, v);
        else e.setAttribute(k, v === true ? "" : v);
      }
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const code = (t) => el("code", null, t);
  const txLink = (id) => el("a", { href: "#/tx/" + encodeURIComponent(id) }, id);
  function table(caption, headers, rows, attrs) {
    return el(
      "table",
      attrs || null,
      el("caption", null, caption),
      el("thead", null, el("tr", null, headers.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", null, rows),
    );
  }
  function facts(pairs) {
    const dl = el("dl", { class: "facts" });
    for (const [k, v] of pairs) {
      if (v === undefined) continue;
      dl.appendChild(el("dt", null, k));
      dl.appendChild(el("dd", null, v));
    }
    return dl;
  }
  const msg = (t) => ($("message").textContent = t || "");
  const err = (t) => ($("error").textContent = t || "");
  const fmtTime = (ms) => (ms ? new Date(ms).toLocaleString() : "");
  function countdown(ms) {
    const d = ms - Date.now();
    const s = Math.round(Math.abs(d) / 1000);
    const txt = s >= 3600 ? Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"
      : s >= 60 ? Math.floor(s / 60) + " min " + (s % 60) + " s" : s + " s";
    return d >= 0 ? "in " + txt : txt + " ago";
  }

  // ---- API ---------------------------------------------------------------------------------
  async function api(method, path, body) {
    const headers = { Authorization: "Bearer " + key, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await res.text();
    let json = {};
    try { json = text ? JSON.parse(text) : {}; } catch (_) { json = { detail: text }; }
    if (!res.ok) {
      const e = new Error(res.status + " " + (json.code || res.statusText) + ": " + (json.detail || ""));
      e.status = res.status;
      e.body = json;
      if (res.status === 401) signedOut(e.message);
      throw e;
    }
    return json;
  }

  // Every page of a cursor-paged list (at most `max` items).
  async function all(path, max) {
    const out = [];
    let cursor = null;
    do {
      const sep = path.includes("?") ? "&" : "?";
      const page = await api("GET", path + sep + "limit=500" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
      out.push(...page.data);
      cursor = page.has_more ? page.next_cursor : null;
    } while (cursor && out.length < (max || 10000));
    return out;
  }

  // Server-sent events over fetch (the key goes in a header). Calls onEvent(name, data) and
  // reconnects after the server ends the stream, until the returned stop() is called.
  function sse(path, onEvent, onState) {
    let stopped = false;
    let ctrl = null;
    async function run() {
      while (!stopped) {
        ctrl = new AbortController();
        try {
          const res = await fetch(path, { headers: { Authorization: "Bearer " + key, Accept: "text/event-stream" }, signal: ctrl.signal });
          if (!res.ok) {
            const body = await res.json().catch(() => ({}));
            if (res.status === 401) return signedOut("401: " + (body.detail || ""));
            onState && onState("error", res.status + " " + (body.detail || res.statusText));
            await new Promise((r) => setTimeout(r, 3000));
            continue;
          }
          onState && onState("live");
          const reader = res.body.getReader();
          const dec = new TextDecoder();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let i;
            while ((i = buf.indexOf("\n\n")) >= 0) {
              const block = buf.slice(0, i);
              buf = buf.slice(i + 2);
              let name = "message";
              const data = [];
              for (const line of block.split("\n")) {
                if (line.startsWith("event:")) name = line.slice(6).trim();
                else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
              }
              if (data.length) {
                let parsed;
                try { parsed = JSON.parse(data.join("\n")); } catch (_) { continue; }
                onEvent(name, parsed);
              }
            }
          }
        } catch (e) {
          if (stopped) return;
          onState && onState("error", e.message);
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
    }
    run();
    return () => { stopped = true; if (ctrl) ctrl.abort(); };
  }

  // ---- confirmation dialog -----------------------------------------------------------------
  // Resolves with the note (or "" without one) when confirmed, null when cancelled.
  function confirmDialog({ title, text, list, okLabel, note }) {
    return new Promise((resolve) => {
      const dlg = $("confirm");
      $("confirm-title").textContent = title;
      $("confirm-text").textContent = text;
      $("confirm-list").replaceChildren(...(list || []).map((x) => el("li", null, x)));
      $("confirm-list").hidden = !(list && list.length);
      $("confirm-note-wrap").hidden = !note;
      $("confirm-note").value = "";
      $("confirm-note").required = !!note;
      $("confirm-ok").textContent = okLabel;
      dlg.returnValue = "";
      const back = document.activeElement;
      dlg.onclose = () => {
        if (back && back.isConnected) back.focus();
        resolve(dlg.returnValue === "ok" ? $("confirm-note").value.trim() : null);
      };
      dlg.showModal();
      (note ? $("confirm-note") : $("confirm-cancel")).focus();
    });
  }

  // ---- sign in -----------------------------------------------------------------------------
  function signedOut(text) {
    if (stopView) { stopView(); stopView = null; }
    key = "";
    me = null;
    sessionStorage.removeItem(KEY);
    $("nav").hidden = true;
    $("signout").hidden = true;
    $("who").textContent = "";
    showSignin();
    err(text || "");
  }

  function showSignin() {
    if (stopView) { stopView(); stopView = null; }
    $("view").replaceChildren(signinSection);
    document.title = "Tidegate console";
    $("key").focus();
  }

  async function signIn() {
    try {
      me = await api("GET", "/v1/whoami");
    } catch (e) {
      if (e.status !== 401) signedOut("Sign-in failed: " + e.message);
      return;
    }
    $("who").textContent = "Tenant " + me.tenant + " · " + me.role + " (" + me.key_id + ")";
    $("signout").hidden = false;
    $("nav").hidden = false;
    for (const a of document.querySelectorAll("#nav a[data-needs=ledger]")) a.parentElement.hidden = !can.ledger();
    err("");
    if (!location.hash || location.hash === "#" || location.hash === "#/") location.hash = "#/live";
    else route();
  }

  // ---- router ------------------------------------------------------------------------------
  const views = {
    live: viewLive,
    tx: viewTx,
    attention: viewAttention,
    plans: viewPlans,
    review: viewReview,
    registry: viewRegistry,
    ledger: viewLedger,
    picture: viewPicture,
  };

  async function route() {
    if (!me) return;
    if (stopView) { stopView(); stopView = null; }
    const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    const name = views[parts[0]] ? parts[0] : "live";
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.view === name || (name === "tx" && a.dataset.view === "live")) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    msg("");
    err("");
    const v = $("view");
    v.replaceChildren();
    v.dataset.view = name;
    try {
      await views[name](v, parts.slice(1));
    } catch (e) {
      err(e.message);
    }
    const h = v.querySelector("h1");
    if (h) document.title = h.textContent + " · Tidegate console";
    v.focus({ preventScroll: true });
  }

  // ---- 1. live transactions ----------------------------------------------------------------
  function footprint(tx) {
    const scopes = tx.may_touch ? tx.may_touch : null;
    const touched = [...new Set([...tx.reads.map((r) => r.scope), ...tx.effects.flatMap((e) => e.scopes)])];
    const parts = [];
    parts.push(scopes ? el("span", null, "may touch: ", ...scopes.map((s, i) => [i ? ", " : "", code(s)])) : el("span", { class: "muted" }, "may touch: anything (undeclared)"));
    if (touched.length) parts.push(el("br"), el("span", null, "touched: ", ...touched.map((s, i) => [i ? ", " : "", code(s)])));
    return parts;
  }

  const CAUSE = {
    overlap: "an earlier transaction may touch an overlapping scope (commits are ordered by epoch)",
    undeclared: "an earlier open transaction declared no may-touch set, so it may touch anything until it seals",
    predecessor: "this one read its write, and that commit is still releasing",
    releasing: "an overlapping commit is still releasing (first-committer-wins)",
    frontier: "every earlier unfinished transaction (global frontier)",
  };

  function waitsFor(tx) {
    if (!tx.waits_for || !tx.waits_for.length) return tx.state === "waiting" ? el("span", { class: "muted" }, "deciding") : "";
    return el("ul", { class: "waits" }, tx.waits_for.map((w) => el("li", null,
      txLink(w.transaction), " (", w.agent || "?", ", ", w.state, ") — ",
      w.scope ? [code(w.scope), " overlaps its ", code(w.theirs)] : el("span", { title: CAUSE[w.cause] || "" }, w.cause === "undeclared" ? "it may touch anything (no may-touch set)" : CAUSE[w.cause] || w.cause),
    )));
  }

  function leaseCell(tx) {
    if (tx.state !== "open" && tx.state !== "sealed") return el("span", { class: "muted" }, "released at commit request");
    const left = tx.lease_expires_at_ms - Date.now();
    return el("span", { class: left < 0 ? "expired" : "" }, left < 0 ? "expired " + countdown(tx.lease_expires_at_ms) : "expires " + countdown(tx.lease_expires_at_ms));
  }

  function liveRow(tx) {
    return el("tr", { id: "row-" + tx.id, dataset: { state: tx.state, id: tx.id } },
      el("td", null, txLink(tx.id)),
      el("td", null, tx.agent),
      el("td", null, el("span", { class: "state state-" + tx.state }, tx.state)),
      el("td", { class: "num" }, String(tx.epoch)),
      el("td", null, footprint(tx)),
      el("td", null, leaseCell(tx)),
      el("td", { class: "waits-cell" }, waitsFor(tx)),
    );
  }

  async function viewLive(v) {
    const t0 = performance.now();
    const txs = new Map();
    let filterState = sessionStorage.getItem("tidegate.console.live.state") || "";
    let filterAgent = "";
    const status = el("p", { class: "summary", role: "status", id: "live-status" }, "Connecting…");
    const stateSel = el("select", { id: "live-state" },
      ["", "open", "sealed", "waiting", "committing", "aborting"].map((s) => el("option", { value: s, selected: s === filterState }, s || "all unfinished")));
    const agentIn = el("input", { id: "live-agent", type: "search", placeholder: "agent name" });
    const tbody = el("tbody", { id: "live-rows" });
    const tbl = el("table", { id: "live-table" },
      el("caption", null, "Unfinished transactions, oldest first; updated live"),
      el("colgroup", null, ["c-tx", "c-agent", "c-state", "c-epoch", "c-foot", "c-lease", "c-waits"].map((c) => el("col", { class: c }))),
      el("thead", null, el("tr", null, ["Transaction", "Agent", "State", "Epoch", "Footprint", "Lease", "Waits for"].map((h) => el("th", { scope: "col" }, h)))),
      tbody);
    v.append(
      el("h1", null, "Live transactions"),
      el("p", null, "Open, sealed, waiting, committing and aborting transactions of tenant ", me.tenant,
        ". For a waiting one, the engine names each earlier transaction its commit waits for and the scopes that overlap."),
      el("div", { class: "filters" },
        el("div", null, el("label", { for: "live-state" }, "State"), stateSel),
        el("div", null, el("label", { for: "live-agent" }, "Agent"), agentIn)),
      status, tbl);
    let pending = false;
    let first = true;
    // Rows are rebuilt only for transactions that changed (a change replaces the object) and
    // on the lease tick; 1,000 unchanged rows are moved, not rebuilt.
    let rowCache = new Map();
    function render() {
      pending = false;
      const rows = [];
      const counts = {};
      const sorted = [...txs.values()].sort((a, b) => num(a.id) - num(b.id));
      for (const tx of sorted) {
        counts[tx.state] = (counts[tx.state] || 0) + 1;
        if (filterState && tx.state !== filterState) continue;
        if (filterAgent && !tx.agent.includes(filterAgent)) continue;
        const hit = rowCache.get(tx.id);
        const tr = hit && hit.tx === tx ? hit.tr : liveRow(tx);
        rowCache.set(tx.id, { tx, tr });
        rows.push(tr);
      }
      for (const id of rowCache.keys()) if (!txs.has(id)) rowCache.delete(id);
      tbody.replaceChildren(...rows);
      const summary = Object.entries(counts).map(([k, n]) => n + " " + k).join(", ");
      status.textContent = txs.size + " unfinished" + (summary ? ": " + summary : "") + (rows.length !== txs.size ? " (showing " + rows.length + ")" : "");
      if (first) {
        first = false;
        perf.liveFirstRenderMs = performance.now() - t0;
        perf.liveRows = rows.length;
        // After the frame that paints the rows.
        requestAnimationFrame(() => setTimeout(() => {
          perf.liveFirstPaintMs = performance.now() - t0;
          tbl.dataset.rendered = String(rows.length);
        }, 0));
      }
      tbl.dataset.count = String(rows.length);
    }
    const schedule = () => { if (!pending) { pending = true; requestAnimationFrame(render); } };
    const num = (id) => Number(id.slice(id.lastIndexOf("_") + 1));
    stateSel.addEventListener("change", () => { filterState = stateSel.value; sessionStorage.setItem("tidegate.console.live.state", filterState); schedule(); });
    agentIn.addEventListener("input", () => { filterAgent = agentIn.value.trim(); schedule(); });
    const stop = sse("/v1/transactions/stream", (name, data) => {
      if (name === "snapshot") {
        txs.clear();
        for (const tx of data.data) txs.set(tx.id, tx);
        schedule();
      } else if (name === "changes") {
        for (const tx of data.data) {
          if (tx.outcome) txs.delete(tx.id);
          else txs.set(tx.id, tx);
        }
        schedule();
      } else if (name === "resync") {
        txs.clear();
      }
    }, (s, detail) => { if (s === "error") status.textContent = "Stream interrupted (" + detail + "); reconnecting…"; });
    // Lease countdowns move without events.
    const tick = setInterval(() => { rowCache = new Map(); schedule(); }, 5000);
    stopView = () => { stop(); clearInterval(tick); };
  }

  // ---- 2. a transaction's timeline ---------------------------------------------------------
  function eventSummary(e) {
    const d = e.data || {};
    switch (e.event) {
      case "begin": return ["agent ", code(d.agent), ", epoch ", String(d.epoch), d.may_touch ? [", may touch ", code(d.may_touch.join(", "))] : ", no may-touch set"];
      case "read": return ["read ", code(d.scope), " at version ", String(d.version)];
      case "effect_recorded": return ["effect ", String(d.effect), ": ", code(d.tool), " (", d.class, ") key ", code(d.key), " on ", code((d.scopes || []).join(", "))];
      case "effect_executed": return ["effect ", String(d.effect), " executed"];
      case "effect_failed": return ["effect ", String(d.effect), " failed", d.unknown ? " (outcome unknown)" : "", ": ", d.error];
      case "sealed": return ["sealed: footprint frozen"];
      case "decided": return d.commit ? ["decided: commit (stamp ", String(d.stamp), ")"] : ["decided: abort — ", JSON.stringify(d.reason)];
      case "release_started": return ["release of effect ", String(d.effect), " started"];
      case "released": return ["effect ", String(d.effect), d.error ? [" release failed", d.unknown ? " (unknown)" : "", ": ", d.error] : " released"];
      case "compensated": return ["effect ", String(d.effect), d.error ? [" compensation failed: ", d.error] : " compensated", d.residue ? [" (residue: ", d.residue, ")"] : ""];
      case "settled": return ["settled: ", d.committed ? "committed" : "aborted", "; ", (d.effects || []).map((x) => JSON.stringify(x)).join(" ")];
      default: return [el("code", null, JSON.stringify(d))];
    }
  }

  async function viewTx(v, [id]) {
    if (!id) { location.hash = "#/live"; return; }
    v.append(el("h1", null, "Transaction ", id));
    const body = el("div", { id: "tx-body" });
    v.append(body);
    async function load() {
      const tx = await api("GET", "/v1/transactions/" + encodeURIComponent(id));
      const events = [];
      const attempts = [];
      let after = null;
      for (let i = 0; i < 20; i++) {
        const page = await api("GET", "/v1/transactions/" + encodeURIComponent(id) + "/timeline?limit=500" + (after ? "&after_lsn=" + after : ""));
        events.push(...page.events);
        if (i === 0 || !page.has_more) attempts.splice(0, attempts.length, ...page.attempts);
        if (!page.has_more) break;
        after = page.next_cursor;
      }
      const out = tx.outcome;
      const decided = events.find((e) => e.event === "decided");
      const parts = [
        facts([
          ["State", el("span", { class: "state state-" + tx.state, id: "tx-state" }, tx.state)],
          ["Agent", tx.agent],
          ["Epoch", String(tx.epoch)],
          ["Footprint", footprint(tx)],
          ["Lease", out ? undefined : leaseCell(tx)],
          ["Waits for", tx.waits_for && tx.waits_for.length ? waitsFor(tx) : undefined],
          ["Decision", out ? (out.committed ? "committed" : "aborted") + (out.reason ? " — " + out.reason.kind + ": " + out.reason.message : "") + (out.clean ? "" : " (not clean)") : decided ? "decided, settling" : "not decided"],
        ]),
        el("h2", null, "Reads"),
        tx.reads.length ? table("Reads, with the version each saw", ["Scope", "Version"], tx.reads.map((r) => el("tr", null, el("td", null, code(r.scope)), el("td", { class: "num" }, String(r.version))))) : el("p", { class: "muted" }, "No reads."),
        el("h2", null, "Effects"),
        tx.effects.length ? table("Effects in issuance order", ["#", "Tool", "Class", "Key", "Scopes", "Status", "Disposition", "Tag", "Detail"],
          tx.effects.map((e) => el("tr", null,
            el("td", { class: "num" }, String(e.effect)), el("td", null, e.tool), el("td", null, e.class || ""), el("td", null, code(e.key)),
            el("td", null, code(e.scopes.join(", "))), el("td", null, e.status), el("td", null, e.disposition || ""),
            el("td", null, e.tag ? el("span", { class: "tag tag-" + e.tag }, e.tag) : ""),
            el("td", null, [e.error ? "error: " + e.error : "", e.outcome_unknown ? " (outcome unknown)" : "", e.residue ? " residue: " + e.residue : ""].join("")))))
          : el("p", { class: "muted" }, "No effects."),
        el("h2", null, "Releases, compensations and hook calls"),
        attempts.length ? table("Dispatch attempts (releases, compensations, probes; operator retries included)", ["Key sent", "Operation", "Capability", "Attempt", "Kind", "Result", "Started", "Took", "Detail"],
          attempts.map((a) => el("tr", null, el("td", null, code(a.key || "")), el("td", null, a.operation || ""), el("td", null, a.capability || ""),
            el("td", { class: "num" }, String(a.attempt ?? "")), el("td", null, a.kind || ""), el("td", null, a.result || ""),
            el("td", null, fmtTime(a.started_at_ms)), el("td", { class: "num" }, a.finished_at_ms ? (a.finished_at_ms - a.started_at_ms) + " ms" : "running"),
            el("td", null, a.detail || ""))))
          : el("p", { class: "muted" }, "No dispatch attempts recorded by this server."),
        el("h2", null, "Ledger events"),
        table("Every ledger event of the transaction (hook verdicts appear in the decision's reason)", ["LSN", "Event", "What"],
          events.map((e) => el("tr", null, el("td", { class: "num" }, String(e.lsn)), el("td", null, e.event), el("td", null, eventSummary(e))))),
      ];
      body.replaceChildren(...parts);
      return tx;
    }
    const tx = await load();
    if (!tx.outcome) {
      // Refresh while it is unfinished: its own event stream says when it changed (and what it
      // waits for is re-read with it); the stream ends after the settlement.
      let timer = null;
      let last = JSON.stringify(tx);
      let stop = () => {};
      stop = sse("/v1/transactions/" + encodeURIComponent(id) + "/events", (name, data) => {
        if (name !== "state") return;
        if (data.outcome) stop();
        const now = JSON.stringify(data);
        if (now === last) return;
        last = now;
        clearTimeout(timer);
        timer = setTimeout(() => load().catch((e) => err(e.message)), 100);
      });
      // What it waits for can change without an event of its own: re-read it while it waits.
      const poll = setInterval(() => {
        if (["sealed", "waiting"].includes(($("tx-state") || {}).textContent)) load().catch((e) => err(e.message));
      }, 3000);
      stopView = () => { stop(); clearTimeout(timer); clearInterval(poll); };
    }
  }

  // ---- 3. attention ------------------------------------------------------------------------
  async function viewAttention(v) {
    v.append(el("h1", null, "Attention"),
      el("p", null, "Effects that settled unresolved, leaked or as a partial commit, transactions whose lease has expired, and stuck plans: each with what can be done about it."));
    if (!can.ledger()) {
      v.append(el("p", null, "The attention list needs the reviewer, operator or admin role."));
      return;
    }
    const onlyOpen = el("input", { type: "checkbox", id: "att-open", checked: true });
    const list = el("div", { id: "attention-list" });
    v.append(el("div", { class: "filters" }, el("div", null, el("label", { for: "att-open" }, onlyOpen, " Hide resolved entries"))), list);
    async function load() {
      const q = onlyOpen.checked ? "?resolved=false" : "";
      const entries = await all("/v1/ledger/attention" + q, 5000);
      const rows = entries.map((a) => {
        const actions = el("td", null);
        if (a.resolution) {
          actions.append(el("span", { class: "resolved" }, a.resolution.action), " by ", a.resolution.by, ", ", fmtTime(a.resolution.at_ms), ": ", a.resolution.note);
        }
        if (can.resolve()) {
          const label = a.transaction + " effect " + a.effect.effect;
          actions.append(
            el("div", { class: "bar" },
              el("button", { type: "button", dataset: { action: "resolve", tx: a.transaction, effect: a.effect.effect }, onclick: () => act(a, "resolved") }, "Mark resolved"),
              el("button", { type: "button", dataset: { action: "retry", tx: a.transaction, effect: a.effect.effect }, onclick: () => retry(a), "aria-label": "Retry " + label }, "Retry"),
              el("button", { type: "button", dataset: { action: "accept", tx: a.transaction, effect: a.effect.effect }, onclick: () => act(a, "accepted"), "aria-label": "Accept " + label }, "Accept")));
          actions.querySelector("[data-action=resolve]").setAttribute("aria-label", "Mark " + label + " resolved");
        }
        return el("tr", { id: "att-" + a.transaction + "-" + a.effect.effect, dataset: { tag: a.tag, resolved: a.resolution ? "yes" : "no" } },
          el("td", null, txLink(a.transaction), a.committed ? " (committed)" : " (aborted)"),
          el("td", null, String(a.effect.effect), ": ", a.effect.tool, " ", code(a.effect.key)),
          el("td", null, el("span", { class: "tag tag-" + a.tag }, a.tag)),
          el("td", null, a.disposition),
          el("td", null, a.effect.error || a.effect.residue || ""),
          actions);
      });
      const parts = [
        el("h2", null, "Effects needing attention"),
        rows.length ? table(entries.length + " entr" + (entries.length === 1 ? "y" : "ies"), ["Transaction", "Effect", "Tag", "Disposition", "Detail", "Resolution"], rows, { id: "attention-table" })
          : el("p", { id: "attention-empty" }, "Nothing needs attention."),
      ];
      // Expired leases: unfinished, open or sealed, past the lease deadline set at begin (the
      // engine's reaper aborts them; an operator may abort at once).
      const unfinished = await all("/v1/transactions?state=unfinished", 10000);
      const expired = unfinished.filter((t) => (t.state === "open" || t.state === "sealed") && t.lease_expires_at_ms < Date.now());
      parts.push(el("h2", null, "Expired leases"));
      parts.push(expired.length ? table("Open or sealed past their lease deadline", ["Transaction", "Agent", "State", "Lease", "Action"],
        expired.map((t) => el("tr", null, el("td", null, txLink(t.id)), el("td", null, t.agent), el("td", null, t.state), el("td", null, leaseCell(t)),
          el("td", null, can.abort() ? el("button", { type: "button", class: "danger", onclick: () => abortTx(t) }, "Abort " + t.id) : "")))) :
        el("p", { class: "muted" }, "No transaction is past its lease."));
      parts.push(el("h2", null, "Stuck plans"));
      parts.push(await stuckPlans());
      list.replaceChildren(...parts);
    }
    async function act(a, action) {
      const label = a.transaction + " effect " + a.effect.effect + " (" + a.effect.tool + ", " + a.tag + ")";
      const note = await confirmDialog({
        title: (action === "resolved" ? "Mark resolved: " : "Accept: ") + label,
        text: action === "resolved" ? "Say what was done outside Tidegate. The note and your key are recorded in the tenant's ledger." : "Accept the effect as it stands. The note and your key are recorded in the tenant's ledger.",
        okLabel: action === "resolved" ? "Mark resolved" : "Accept",
        note: true,
      });
      if (note === null) return;
      if (!note) { err("A note is required."); return; }
      try {
        await api("POST", "/v1/ledger/attention/" + encodeURIComponent(a.transaction) + "/" + a.effect.effect + "/resolve", { action, note });
        msg(label + " " + action + "; recorded in the ledger.");
        await load();
      } catch (e) { err(e.message); }
    }
    async function retry(a) {
      const label = a.transaction + " effect " + a.effect.effect + " (" + a.effect.tool + ", " + a.tag + ")";
      const what = a.committed ? "its " + (a.effect.class === "reversible" || a.effect.class === "reversible_with_cost" || a.effect.class === "idempotent" ? "call" : "release") : "its compensation";
      const ok = await confirmDialog({
        title: "Retry: " + label,
        text: "Send " + what + " again through the tool's capability, with the same idempotency key. The retry and its outcome are recorded in the tenant's ledger; a retry that is confirmed done resolves the entry.",
        okLabel: "Retry",
      });
      if (ok === null) return;
      try {
        const r = await api("POST", "/v1/ledger/attention/" + encodeURIComponent(a.transaction) + "/" + a.effect.effect + "/retry", {});
        msg(label + ": retried " + r.operation + ", " + r.outcome + (r.detail ? " (" + r.detail + ")" : "") + "; recorded in the ledger.");
        await load();
      } catch (e) { err(e.message); }
    }
    async function abortTx(t) {
      const ok = await confirmDialog({ title: "Abort " + t.id + "?", text: "Its held effects are dropped and executed ones compensated.", okLabel: "Abort " + t.id });
      if (ok === null) return;
      try {
        await api("POST", "/v1/transactions/" + encodeURIComponent(t.id) + "/abort", { reason: "aborted from the console by " + me.key_id + ": lease expired", wait_ms: 5000 });
        msg(t.id + " aborted.");
        await load();
      } catch (e) { err(e.message); }
    }
    onlyOpen.addEventListener("change", () => load().catch((e) => err(e.message)));
    await load();
  }

  // The owner-intervention queue (crates/server/src/api/plans.rs): GET /v1/plans/stuck →
  // {stuck: [{id, owner, reason: {kind, ..}, choices}]}; POST /v1/plans/{plan}/resolve {choice}.
  // On a server without plans (404) it says plans are not available.
  async function stuckPlans() {
    let res;
    try {
      res = await api("GET", "/v1/plans/stuck");
    } catch (e) {
      if (e.status === 404) return el("p", { class: "muted", id: "stuck-plans-unavailable" }, "Plans are not available on this server.");
      return el("p", { class: "error" }, e.message);
    }
    const plans = res.stuck || [];
    if (!plans.length) return el("p", { class: "muted", id: "stuck-plans-none" }, "No stuck plan.");
    return table("Stuck plans (the owner-intervention queue)", ["Plan", "Owner", "Why", "Action"], plans.map((p) => el("tr", { id: "stuck-" + p.id },
      el("td", null, el("a", { href: "#/plans/" + encodeURIComponent(p.id) }, p.id)),
      el("td", null, p.owner || ""),
      el("td", null, reasonText(p.reason)),
      el("td", null, resolveBar(p, p.choices || ["retry", "accept", "unwind"])))));
  }

  function resolveBar(p, choices) {
    if (!can.plan()) return el("span", { class: "muted" }, "Resolving needs a key with plans.resolve (the agent, operator or admin role).");
    return el("div", { class: "bar" }, choices.map((c) =>
      el("button", { type: "button", dataset: { choice: c }, onclick: () => resolvePlan(p, c) }, c[0].toUpperCase() + c.slice(1) + " " + p.id)));
  }

  function reasonText(r) {
    if (!r) return "";
    if (typeof r === "string") return r;
    const rest = Object.entries(r).filter(([k]) => k !== "kind").map(([k, v]) => k + ": " + (typeof v === "object" ? JSON.stringify(v) : v));
    return [r.kind || "", rest.length ? " (" + rest.join(", ") + ")" : ""].join("");
  }

  async function resolvePlan(p, choice) {
    const what = { retry: "reopen the plan", accept: "end it accepted, retiring what is left", unwind: "unwind what can be compensated, last first" }[choice] || choice;
    const ok = await confirmDialog({ title: choice + " " + p.id + "?", text: "This will " + what + ". The choice is recorded in the plan's log.", okLabel: choice + " " + p.id });
    if (ok === null) return;
    try {
      await api("POST", "/v1/plans/" + encodeURIComponent(p.id) + "/resolve", { choice });
      await route();
      msg(p.id + ": " + choice);
    } catch (e) { err(e.message); }
  }

  // ---- 4. plans ----------------------------------------------------------------------------
  // Against crates/server/src/api/plans.rs (docs/console.md "Plans"): GET /v1/plans → {plans:
  // [Plan]}, GET /v1/plans/{plan} → Plan {id, owner, state, stuck?, failure?, steps: [tx id],
  // held, deadline_ms?, cascade_limit, registrations: [..] (unwind order), triggers: [{kind,
  // value: "true" | "unknown" | "false", detail}]}.
  async function viewPlans(v, [id]) {
    v.append(el("h1", null, id ? "Plan " + id : "Plans"));
    let data;
    try {
      data = await api("GET", id ? "/v1/plans/" + encodeURIComponent(id) : "/v1/plans");
    } catch (e) {
      if (e.status === 404 && !id) {
        v.append(el("p", { id: "plans-unavailable" }, "Plans are not available on this server."));
        return;
      }
      throw e;
    }
    const deadlineCell = (ms) => ms ? el("span", { class: ms < Date.now() ? "expired" : "", dataset: { deadline: ms } }, fmtTime(ms) + " (" + countdown(ms) + ")") : el("span", { class: "muted" }, "none");
    if (!id) {
      const plans = data.plans || [];
      v.append(plans.length ? table(plans.length + " plan(s), oldest first", ["Plan", "State", "Owner", "Steps", "Held compensations", "Deadline"], plans.map((p) => el("tr", { id: "plan-" + p.id },
        el("td", null, el("a", { href: "#/plans/" + encodeURIComponent(p.id) }, p.id)), el("td", null, el("span", { class: "state" }, p.state || "")), el("td", null, p.owner || ""),
        el("td", { class: "num" }, String((p.steps || []).length)), el("td", { class: "num" }, String(p.held ?? "")), el("td", null, deadlineCell(p.deadline_ms)))), { id: "plans-table" })
        : el("p", { id: "plans-none" }, "No plans."));
    } else {
      const p = data;
      const val = (x) => (x === "true" || x === "false" ? x : "unknown");
      const regs = p.registrations || [];
      const failure = (f) => reasonText(f.cause) + (f.depth ? " at cascade depth " + f.depth : "");
      v.append(
        facts([
          ["State", el("span", { class: "state", id: "plan-state" }, p.state || "")],
          ["Owner", p.owner || ""],
          ["Deadline", deadlineCell(p.deadline_ms)],
          ["Cascade limit", p.cascade_limit === undefined ? undefined : String(p.cascade_limit)],
          ["Failed because", p.failure ? failure(p.failure) : undefined],
          ["Stuck because", p.stuck ? reasonText(p.stuck) : undefined],
        ]),
        ...(p.state === "stuck" ? [el("div", { id: "plan-resolve" }, resolveBar(p, ["retry", "accept", "unwind"]))] : []),
        el("h2", null, "Steps"),
        (p.steps || []).length ? el("ol", { class: "steps", id: "plan-steps" }, p.steps.map((s) => el("li", null, txLink(s)))) : el("p", { class: "muted" }, "No steps yet."),
        el("h2", null, "Compensations, in the order they would unwind"),
        regs.length ? table((p.held ?? regs.length) + " held; the unwind runs top to bottom", ["Seq", "Step", "Effect", "Tool", "Key", "Compensation", "Forward", "State", "Verdict", "Attempts"],
          regs.map((r) => el("tr", { dataset: { seq: r.seq } }, el("td", { class: "num" }, String(r.seq)), el("td", null, r.transaction ? txLink(r.transaction) : ""), el("td", { class: "num" }, String(r.effect ?? "")),
            el("td", null, r.tool || ""), el("td", null, r.key ? code(r.key) : ""), el("td", null, r.compensation ? code(JSON.stringify(r.compensation)) : el("span", { class: "muted" }, "none (not compensable)")),
            el("td", null, r.forward || ""), el("td", null, r.state || ""), el("td", null, r.verdict || ""), el("td", { class: "num" }, String(r.attempts ?? "")))), { id: "plan-registrations" })
          : el("p", { class: "muted" }, "No compensation held."),
        el("h2", null, "Triggers"),
        (p.triggers || []).length ? table("Triggers and their current value", ["Kind", "Detail", "Value"], p.triggers.map((t) => el("tr", null,
          el("td", null, t.kind), el("td", null, t.kind === "deadline" && typeof t.detail === "number" ? deadlineCell(t.detail) : typeof t.detail === "string" ? t.detail : code(JSON.stringify(t.detail))),
          el("td", null, el("strong", { class: "trigger-" + val(t.value) }, val(t.value))))), { id: "plan-triggers" })
          : el("p", { class: "muted" }, "No triggers."),
      );
    }
    const tick = setInterval(() => {
      for (const e of v.querySelectorAll("[data-deadline]")) { const ms = Number(e.dataset.deadline); e.textContent = fmtTime(ms) + " (" + countdown(ms) + ")"; }
    }, 1000);
    stopView = () => clearInterval(tick);
  }

  // ---- 5. review queue ---------------------------------------------------------------------
  async function viewReview(v) {
    v.append(el("h1", null, "Review queue"),
      el("p", null, "LLM-generated database transactions buffered for review: their SQL, parameters and sender, and what waits on each."));
    const summary = el("p", { class: "summary", id: "review-summary", role: "status" });
    const list = el("div", { id: "review-list" });
    v.append(summary, list);
    async function load() {
      let q;
      try {
        q = await api("GET", "/v1/review/queue");
      } catch (e) {
        if (e.status === 503) { summary.textContent = "Review is not configured for this tenant (" + e.message + ")."; list.replaceChildren(); return; }
        throw e;
      }
      summary.textContent = q.total + " transaction(s) not final, " + q.reviewable + " awaiting a reviewer" + (q.data.length < q.total ? " (showing the oldest " + q.data.length + ")" : "");
      list.replaceChildren(...q.data.map((tx) => {
        const card = el("section", { class: "card", id: "rv-" + tx.id, dataset: { status: tx.status }, "aria-labelledby": "rvh-" + tx.id },
          el("h2", { id: "rvh-" + tx.id }, tx.id, " · ", tx.template, tx.suspicious ? " · suspicious" : ""),
          facts([
            ["Status", tx.status.replace(/_/g, " ")],
            ["Sender", tx.sender],
            ["SQL", el("pre", null, tx.sql.join(";\n") + (tx.sql.length ? ";" : ""))],
            ["Parameters", el("pre", null, JSON.stringify(tx.params, null, 2))],
            ["Waits for", tx.waits_for.length ? tx.waits_for.join(", ") : "nothing"],
            ["Waiting on it", tx.waited_by.length ? tx.waited_by.join(", ") : "nothing"],
            ["Removal also removes", tx.reviewable ? (tx.removal_cascade.length ? tx.removal_cascade.join(", ") : "nothing else") : undefined],
          ]));
        if (tx.reviewable && can.review()) {
          card.append(el("div", { class: "bar" },
            el("button", { type: "button", class: "primary", dataset: { action: "accept" }, onclick: () => decide(tx, "accept") }, "Accept " + tx.id),
            el("button", { type: "button", class: "danger", dataset: { action: "remove" }, onclick: () => decide(tx, "remove") }, "Remove " + tx.id)));
        }
        return card;
      }));
    }
    async function decide(tx, action) {
      const ok = await confirmDialog(action === "remove" ? {
        title: "Remove " + tx.id + "?",
        text: tx.removal_cascade.length ? "Removing it also removes these transactions, which build on it:" : "Removing it takes nothing else with it.",
        list: tx.removal_cascade,
        okLabel: "Remove " + tx.id,
      } : {
        title: "Accept " + tx.id + "?",
        text: "Accepting keeps it" + (tx.waits_for.length ? " (it runs once " + tx.waits_for.join(", ") + " are resolved)." : "."),
        okLabel: "Accept " + tx.id,
      });
      if (ok === null) return;
      try {
        const r = await api("POST", "/v1/review/transactions/" + encodeURIComponent(tx.id) + "/" + action);
        msg(tx.id + " is now " + r.transaction.status.replace(/_/g, " ") + (r.cascaded.length ? "; also removed: " + r.cascaded.join(", ") : ""));
      } catch (e) { err(e.message); }
      await load().catch((e) => err(e.message));
    }
    await load();
    if (!can.review()) v.insertBefore(el("p", { class: "muted" }, "Your role can read the queue; accepting and removing needs the reviewer or admin role."), summary);
  }

  // ---- 6. registry and ledger --------------------------------------------------------------
  async function viewRegistry(v) {
    v.append(el("h1", null, "Tool registry"));
    const [tools, caps] = await Promise.all([api("GET", "/v1/tools"), api("GET", "/v1/capabilities")]);
    v.append(
      tools.data.length ? table(tools.data.length + " tool(s)", ["Tool", "Class", "Scopes", "Key", "Capabilities", "Signature", "Description"],
        tools.data.map((t) => { const d = t.definition || t.def || {}; return el("tr", null,
          el("td", null, t.name), el("td", null, d.class || ""), el("td", null, code((d.scopes || []).join(", "))), el("td", null, d.key ? code(d.key) : ""),
          el("td", null, ["call", "compensate", "probe"].filter((k) => d[k]).map((k) => k + ": " + d[k]).join("; ")),
          el("td", { class: "num" }, t.signature == null ? "" : String(t.signature)), el("td", null, d.description || "")); }), { id: "tools-table" })
        : el("p", null, "No tools."),
      el("h2", null, "Capabilities"),
      caps.data.length ? table(caps.data.length + " capabilit" + (caps.data.length === 1 ? "y" : "ies"), ["Capability", "Definition"],
        caps.data.map((c) => el("tr", null, el("td", null, c.name), el("td", null, code(JSON.stringify(c.spec || c.definition || c)))))) : el("p", null, "No capabilities."),
    );
  }

  async function viewLedger(v) {
    v.append(el("h1", null, "Ledger"));
    if (!can.ledger()) { v.append(el("p", null, "The ledger needs the reviewer, operator or admin role.")); return; }
    const f = {
      agent: el("input", { id: "lf-agent", type: "text" }),
      scope: el("input", { id: "lf-scope", type: "text", placeholder: "e.g. travel:hotel" }),
      outcome: el("select", { id: "lf-outcome" }, ["", "committed", "aborted", "unfinished"].map((o) => el("option", { value: o }, o || "any"))),
      from: el("input", { id: "lf-from", type: "datetime-local" }),
      to: el("input", { id: "lf-to", type: "datetime-local" }),
      event: el("input", { id: "lf-event", type: "text", placeholder: "e.g. settled" }),
    };
    const labels = { agent: "Agent", scope: "Scope", outcome: "Outcome", from: "Lease deadline from", to: "to", event: "Event kind" };
    const form = el("form", { class: "filters", id: "ledger-filters" },
      Object.entries(f).map(([k, input]) => el("div", null, el("label", { for: input.id }, labels[k]), input)),
      el("div", null, el("button", { type: "submit" }, "Apply filters")),
      el("div", null, el("button", { type: "button", id: "ledger-export" }, "Export JSON Lines")));
    const out = el("div", { id: "ledger-out" });
    v.append(el("p", null, "The tenant's ledger, filtered by the transactions' agent, scope, outcome and time (the lease deadline set at begin, the one clock reading the ledger keeps)."), form, out);
    function query() {
      const p = new URLSearchParams();
      for (const k of ["agent", "scope", "outcome", "event"]) if (f[k].value.trim()) p.set(k, f[k].value.trim());
      if (f.from.value) p.set("from_ms", String(new Date(f.from.value).getTime()));
      if (f.to.value) p.set("to_ms", String(new Date(f.to.value).getTime()));
      return p;
    }
    let rows = [];
    async function load(after) {
      const p = query();
      p.set("limit", "200");
      if (after) p.set("after_lsn", after);
      const page = await api("GET", "/v1/ledger/events?" + p.toString());
      if (!after) rows = [];
      rows.push(...page.data);
      const more = page.has_more ? el("button", { type: "button", id: "ledger-more", onclick: () => load(page.next_cursor).catch((e) => err(e.message)) }, "Load more") : null;
      out.replaceChildren(
        rows.length ? table(rows.length + " event(s)" + (page.has_more ? ", more follow" : ""), ["LSN", "Event", "Transaction", "What"],
          rows.map((e) => el("tr", null, el("td", { class: "num" }, String(e.lsn)), el("td", null, e.event), el("td", null, e.transaction ? txLink(e.transaction) : ""), el("td", null, eventSummary(e)))), { id: "ledger-table" })
          : el("p", null, "No event matches."),
        ...(more ? [more] : []));
    }
    form.addEventListener("submit", (ev) => { ev.preventDefault(); load().catch((e) => err(e.message)); });
    form.querySelector("#ledger-export").addEventListener("click", async () => {
      try {
        const res = await fetch("/v1/ledger/export?" + query().toString(), { headers: { Authorization: "Bearer " + key } });
        if (!res.ok) throw new Error(res.status + " " + (await res.text()));
        const blob = await res.blob();
        const a = el("a", { href: URL.createObjectURL(blob), download: "ledger-" + me.tenant + ".jsonl" });
        document.body.appendChild(a);
        a.click();
        a.remove();
        msg("Exported " + (await blob.text()).split("\n").filter(Boolean).length + " event(s) as JSON Lines.");
      } catch (e) { err(e.message); }
    });
    await load();
  }

  // ---- 7. the last hour --------------------------------------------------------------------
  const COLORS = ["#b5462f", "#7b3fa0", "#c77c00", "#555555", "#a0305a", "#2f6f9f"];
  async function viewPicture(v) {
    v.append(el("h1", null, "The last hour"),
      el("p", null, "Commits, aborts by reason and commits that waited, per minute (the same increments as /metrics, kept since the server started)."));
    const box = el("div", { id: "picture" });
    v.append(box);
    async function load() {
      const s = await api("GET", "/v1/console/series");
      const m = s.minutes;
      const reasons = [...new Set(m.flatMap((x) => Object.keys(x.aborts)))].sort();
      const W = 900, H = 260, L = 40, B = 24, T = 10;
      const max = Math.max(1, ...m.map((x) => Math.max(x.commits, x.waits, Object.values(x.aborts).reduce((a, b) => a + b, 0))));
      const bw = (W - L - 10) / m.length;
      const y = (val) => T + (H - T - B) * (1 - val / max);
      const NS = "http://www.w3.org/2000/svg";
      const svgEl = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const [k, val] of Object.entries(attrs)) e.setAttribute(k, val); if (text) e.textContent = text; return e; };
      const totals = { commits: 0, waits: 0, aborts: 0 };
      const svg = svgEl("svg", { viewBox: "0 0 " + W + " " + H, role: "img", "aria-labelledby": "pic-title pic-desc", id: "picture-svg" });
      svg.append(svgEl("title", { id: "pic-title" }, "Commits, aborts and waits per minute over the last hour"));
      m.forEach((x, i) => { totals.commits += x.commits; totals.waits += x.waits; totals.aborts += Object.values(x.aborts).reduce((a, b) => a + b, 0); });
      svg.append(svgEl("desc", { id: "pic-desc" }, totals.commits + " commits, " + totals.aborts + " aborts and " + totals.waits + " waits in the last hour; the table below has every minute."));
      for (const frac of [0, 0.5, 1]) {
        const val = Math.round(max * frac);
        svg.append(svgEl("line", { x1: L, x2: W - 10, y1: y(val), y2: y(val), stroke: "#ccc" }));
        svg.append(svgEl("text", { x: L - 6, y: y(val) + 4, "text-anchor": "end", "font-size": "11", fill: "#333" }, String(val)));
      }
      m.forEach((x, i) => {
        let base = 0;
        reasons.forEach((r, j) => {
          const n = x.aborts[r] || 0;
          if (!n) return;
          svg.append(svgEl("rect", { x: L + i * bw + 1, width: Math.max(1, bw - 2), y: y(base + n), height: y(base) - y(base + n), fill: COLORS[j % COLORS.length] }));
          base += n;
        });
      });
      const line = (key, color, dash) => svgEl("polyline", { fill: "none", stroke: color, "stroke-width": "2", "stroke-dasharray": dash || "", points: m.map((x, i) => (L + i * bw + bw / 2).toFixed(1) + "," + y(x[key]).toFixed(1)).join(" ") });
      svg.append(line("commits", "#17613a"), line("waits", "#1a5fb4", "5 3"));
      for (const i of [0, 30, m.length - 1]) {
        svg.append(svgEl("text", { x: L + i * bw + bw / 2, y: H - 6, "text-anchor": "middle", "font-size": "11", fill: "#333" }, new Date(m[i].start_ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })));
      }
      // Swatches are SVG (the page's CSP allows no inline style attributes).
      const swatch = (color) => { const s = svgEl("svg", { class: "swatch", viewBox: "0 0 10 10", "aria-hidden": "true" }); s.append(svgEl("rect", { x: 0, y: 0, width: 10, height: 10, fill: color })); return s; };
      const legend = el("ul", { class: "legend" },
        el("li", null, swatch("#17613a"), "commits (line)"),
        el("li", null, swatch("#1a5fb4"), "commits that waited (dashed line)"),
        reasons.map((r, j) => el("li", null, swatch(COLORS[j % COLORS.length]), "aborts: " + r + " (bars)")));
      const rowsTbl = m.filter((x) => x.commits || x.waits || Object.keys(x.aborts).length || x.waiting_max).map((x) => el("tr", null,
        el("td", null, new Date(x.start_ms).toLocaleTimeString()), el("td", { class: "num" }, String(x.commits)),
        el("td", null, Object.entries(x.aborts).map(([r, n]) => r + ": " + n).join(", ")), el("td", { class: "num" }, String(x.waits)), el("td", { class: "num" }, String(x.waiting_max))));
      const chart = el("div", { class: "chart" });
      chart.appendChild(svg);
      box.replaceChildren(
        el("p", { id: "picture-totals" }, totals.commits + " commit(s), " + totals.aborts + " abort(s), " + totals.waits + " commit(s) that waited."),
        chart, legend,
        el("details", null, el("summary", null, "Every minute with activity"),
          rowsTbl.length ? table("Per minute", ["Minute", "Commits", "Aborts by reason", "Waited", "Most waiting"], rowsTbl, { id: "picture-table" }) : el("p", null, "No activity.")));
    }
    await load();
    const tick = setInterval(() => load().catch((e) => err(e.message)), 15000);
    stopView = () => clearInterval(tick);
  }

  // ---- start -------------------------------------------------------------------------------
  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    $("key").value = "";
    sessionStorage.setItem(KEY, key);
    signIn();
  });
  $("signout").addEventListener("click", () => signedOut(""));
  window.addEventListener("hashchange", route);
  // Leaving the page (a navigation, a closed tab, the back-forward cache) ends the view's
  // streams and timers: a page kept in the back-forward cache with its stream open holds one of
  // the browser's six connections to this host, and after a few such pages the next page's
  // requests wait until the server ends those streams. Back from the cache, the view starts
  // again.
  window.addEventListener("pagehide", () => { if (stopView) { stopView(); stopView = null; } });
  window.addEventListener("pageshow", (ev) => { if (ev.persisted) route(); });
  if (key) signIn();
  else $("key").focus();
})();
