// The reviewer's page: signs in with an API key (kept in this tab's sessionStorage), shows the
// review queue and accepts or removes transactions after a confirmation that names the
// removal's cascade. Plain DOM, no dependencies; every control is a native button or input.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY = "tidegate.review.key";
  let key = sessionStorage.getItem(KEY) || "";

  function text(tag, content, cls) {
    const e = document.createElement(tag);
    e.textContent = content;
    if (cls) e.className = cls;
    return e;
  }

  function showError(msg) {
    $("error").textContent = msg || "";
  }

  async function api(method, path) {
    const res = await fetch(path, {
      method,
      headers: { Authorization: "Bearer " + key, Accept: "application/json" },
    });
    const body = await res.json().catch(() => ({}));
    if (!res.ok) {
      const detail = body.detail || res.statusText;
      const err = new Error(res.status + " " + (body.code || "") + ": " + detail);
      err.status = res.status;
      throw err;
    }
    return body;
  }

  function signedOut(msg) {
    key = "";
    sessionStorage.removeItem(KEY);
    $("queue-section").hidden = true;
    $("signin").hidden = false;
    $("who").textContent = "";
    showError(msg);
    $("key").focus();
  }

  async function signIn() {
    try {
      const me = await api("GET", "/v1/whoami");
      $("who").textContent = "Signed in to tenant " + me.tenant + " as " + me.role + " (" + me.key_id + ")";
      $("signin").hidden = true;
      $("queue-section").hidden = false;
      showError("");
      await load();
      $("refresh").focus();
    } catch (e) {
      signedOut("Sign-in failed: " + e.message);
    }
  }

  function field(dl, name, value) {
    dl.appendChild(text("dt", name));
    const dd = document.createElement("dd");
    if (value instanceof Node) dd.appendChild(value);
    else dd.textContent = value;
    dl.appendChild(dd);
  }

  function render(tx) {
    const li = document.createElement("li");
    li.className = "tx";
    li.id = "tx-" + tx.id;
    li.dataset.id = tx.id;
    li.dataset.status = tx.status;
    const h = text("h3", tx.id + " · " + tx.template + " ");
    if (tx.suspicious) h.appendChild(text("span", "suspicious", "suspicious"));
    li.appendChild(h);
    const dl = document.createElement("dl");
    field(dl, "Status", text("span", tx.status.replace(/_/g, " "), "status"));
    field(dl, "Sender", tx.sender);
    field(dl, "SQL", text("pre", tx.sql.join(";\n") + (tx.sql.length ? ";" : "")));
    field(dl, "Parameters", text("pre", JSON.stringify(tx.params, null, 2)));
    field(dl, "Waits for", tx.waits_for.length ? tx.waits_for.join(", ") : "nothing");
    field(dl, "Waiting on it", tx.waited_by.length ? tx.waited_by.join(", ") : "nothing");
    if (tx.reviewable)
      field(dl, "Removal also removes", tx.removal_cascade.length ? tx.removal_cascade.join(", ") : "nothing else");
    li.appendChild(dl);
    if (tx.reviewable) {
      const bar = document.createElement("div");
      bar.className = "bar";
      const acc = text("button", "Accept " + tx.id, "accept");
      acc.type = "button";
      acc.dataset.action = "accept";
      acc.addEventListener("click", () => confirmDecision(tx, "accept"));
      const rem = text("button", "Remove " + tx.id, "remove");
      rem.type = "button";
      rem.dataset.action = "remove";
      rem.addEventListener("click", () => confirmDecision(tx, "remove"));
      bar.appendChild(acc);
      bar.appendChild(rem);
      li.appendChild(bar);
    }
    return li;
  }

  async function load() {
    const q = await api("GET", "/v1/review/queue");
    const ol = $("queue");
    ol.replaceChildren(...q.data.map(render));
    $("summary").textContent =
      q.total + " transaction(s) not final, " + q.reviewable + " awaiting a reviewer" +
      (q.data.length < q.total ? " (showing the oldest " + q.data.length + ")" : "");
  }

  function confirmDecision(tx, action) {
    const dlg = $("confirm");
    $("confirm-title").textContent = (action === "accept" ? "Accept " : "Remove ") + tx.id + "?";
    const list = $("confirm-cascade");
    list.replaceChildren();
    if (action === "remove") {
      $("confirm-text").textContent = tx.removal_cascade.length
        ? "Removing it also removes these transactions, which build on it:"
        : "Removing it takes nothing else with it.";
      for (const id of tx.removal_cascade) list.appendChild(text("li", id));
    } else {
      $("confirm-text").textContent =
        "Accepting keeps it" + (tx.waits_for.length ? " (it runs once " + tx.waits_for.join(", ") + " are resolved)." : ".");
    }
    $("confirm-ok").textContent = (action === "accept" ? "Accept " : "Remove ") + tx.id;
    dlg.returnValue = "";
    dlg.onclose = async () => {
      if (dlg.returnValue !== "ok") return;
      try {
        const r = await api("POST", "/v1/review/transactions/" + encodeURIComponent(tx.id) + "/" + action);
        $("message").textContent =
          tx.id + " is now " + r.transaction.status.replace(/_/g, " ") +
          (r.cascaded.length ? "; also removed: " + r.cascaded.join(", ") : "");
        showError("");
      } catch (e) {
        showError(e.message);
        if (e.status === 401) return signedOut(e.message);
      }
      await load().catch((e) => showError(e.message));
      $("refresh").focus();
    };
    dlg.showModal();
    $("confirm-cancel").focus();
  }

  $("signin-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    key = $("key").value.trim();
    $("key").value = "";
    sessionStorage.setItem(KEY, key);
    signIn();
  });
  $("refresh").addEventListener("click", () => load().catch((e) => showError(e.message)));
  $("signout").addEventListener("click", () => signedOut(""));
  if (key) signIn();
  else $("key").focus();
})();
