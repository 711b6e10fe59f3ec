// portal.js: the student page of labkeep (see the package doc of
// shared/portal). It only ever talks to the API of its own origin, with the
// portal's JWT in the Authorization header, and shows what the server says:
// error messages and end reasons are the server's own sentences, and the
// countdown runs from the server's remainingSeconds, never the computer's
// clock. Feature modules use window.labkeep (at the end).
"use strict";

(function () {
  const api = new URL("..", window.location.href); // the API: the parent of /portal/
  const tokenKey = "labkeep.token";
  const phases = ["scheduled", "booting", "ready"];
  const phaseLabel = { scheduled: "scheduled", unschedulable: "waiting for room", booting: "booting", ready: "SSH ready" };
  // queuePollMs is how often a page in line reads its place: well within
  // the server's idle time (LABKEEP_QUEUE_IDLE, 2 minutes by default),
  // and so is Chromium's slowing of a hidden tab's timers to once a minute.
  const queuePollMs = 5000;
  const $ = (id) => document.getElementById(id);

  const state = {
    token: window.sessionStorage.getItem(tokenKey) || "",
    session: null,
    // anchor is the last server answer's remainingSeconds and when it
    // arrived (performance.now(): monotonic, immune to clock changes).
    anchor: null,
    privateKey: "",
    poll: 0,
    listeners: [],
    retryUntil: 0,
  };

  // call sends one request to the API (labkeepRequest, request.js) and
  // returns the status, the JSON body, Retry-After and the instant the
  // answer arrived. again: resend a change the network dropped (extend
  // and close, whose repetition changes nothing more; never open, whose
  // private key would be lost with a lost answer).
  async function call(method, path, body, again) {
    const sent = await window.labkeepRequest(new URL(path, api), method, state.token, body, again);
    if (sent.offline) {
      return { status: 0, ok: false, data: null, retryAfter: null, received: sent.received, offline: sent.offline };
    }
    const res = sent.res;
    if (res.status === 401) {
      signOut(errorText({ status: 401, data: sent.data }));
    }
    return { status: res.status, ok: res.ok, data: sent.data, retryAfter: res.headers.get("Retry-After"), received: sent.received };
  }

  // errorText is the server's message for a failed answer (request.js).
  const errorText = window.labkeepErrorText;

  function showMessage(text, kind, code) {
    const m = $("message");
    m.textContent = text;
    m.className = kind;
    m.dataset.code = code || "";
    m.hidden = !text;
  }

  // showError shows a failed answer: the server's message, and for
  // no_capacity when to try again (Retry-After), with Open held until then.
  function showError(r) {
    const code = (r.data && r.data.error && r.data.error.code) || "";
    let text = errorText(r);
    if (code === "no_capacity" && r.retryAfter) {
      const secs = parseInt(r.retryAfter, 10);
      if (secs > 0) {
        text += " (try again in " + secs + " s)";
        state.retryUntil = performance.now() + secs * 1000;
      }
    }
    showMessage(text, "error", code);
  }

  function fmtDuration(secs) {
    const h = Math.floor(secs / 3600);
    const m = Math.floor((secs % 3600) / 60);
    const s = secs % 60;
    const two = (n) => String(n).padStart(2, "0");
    return (h > 0 ? h + ":" + two(m) : String(m)) + ":" + two(s);
  }

  function fmtTime(iso) {
    return new Date(iso).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
  }

  function setTime(el, iso) {
    el.dateTime = iso;
    el.textContent = fmtTime(iso);
  }

  // secondsLeft is what the session had left when the server answered:
  // expiresAt − serverTime, both the server's clock (remainingSeconds is
  // the same, rounded up to the second; it is the fallback).
  function secondsLeft(s) {
    const ms = (iso) => Date.parse(String(iso).replace(/(\.\d{3})\d+/, "$1"));
    const left = (ms(s.expiresAt) - ms(s.serverTime)) / 1000;
    if (!Number.isFinite(left)) return s.remainingSeconds;
    return Math.max(0, Math.min(left, s.remainingSeconds));
  }

  // remaining is the countdown: what the session had left at the server's
  // answer less the time since it arrived (performance.now()).
  function remaining() {
    if (!state.anchor) return null;
    const left = state.anchor.seconds - (performance.now() - state.anchor.at) / 1000;
    return Math.max(0, Math.ceil(left));
  }

  function subject(token) {
    try {
      const payload = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      return JSON.parse(window.atob(payload)).sub || "";
    } catch (e) {
      return "";
    }
  }

  function live(s) {
    return s && (s.status === "provisioning" || s.status === "running");
  }

  // queued: the student waits in line (openSession with wait); the
  // session is theirs once served, under the same id.
  function queued(s) {
    return !!s && s.status === "queued";
  }

  // fmtWait is a wait in whole minutes (rounded up), hours beyond one.
  function fmtWait(secs) {
    const mins = Math.max(1, Math.ceil(secs / 60));
    if (mins < 60) return mins + " min";
    const h = Math.floor(mins / 60);
    const m = mins % 60;
    return h + " h" + (m ? " " + m + " min" : "");
  }

  // etaText is the server's estimate in words: likely (etaSeconds) and at
  // the latest (etaLatestSeconds, a bound the wait never exceeds).
  function etaText(s) {
    const likely = s.etaSeconds || 0;
    const latest = s.etaLatestSeconds || 0;
    if (latest <= 0) return "Your lab starts any moment now.";
    return "Your lab starts likely " + (likely > 0 ? "in ~" + fmtWait(likely) : "any moment now") +
      ", at the latest in " + fmtWait(latest) + ".";
  }

  function show(id, on) {
    $(id).hidden = !on;
  }

  // --- sign-in ---------------------------------------------------------

  async function signIn(token) {
    state.token = token.trim();
    if (!state.token) {
      showMessage("paste a token first", "error", "");
      return;
    }
    window.sessionStorage.setItem(tokenKey, state.token);
    const r = await call("GET", "labs");
    if (!r.ok) {
      if (r.status !== 401) showError(r);
      return;
    }
    showMessage("", "", "");
    show("signin", false);
    $("who-name").textContent = subject(state.token);
    show("who", true);
    renderLabs(r.data.labs || []);
    await refresh();
  }

  function signOut(why) {
    state.token = "";
    state.session = null;
    state.anchor = null;
    window.sessionStorage.removeItem(tokenKey);
    window.clearTimeout(state.poll);
    ["who", "labs", "session"].forEach((id) => show(id, false));
    show("signin", true);
    showMessage(why || "", why ? "error" : "", why ? "unauthorized" : "");
  }

  // --- labs and open -----------------------------------------------------

  function renderLabs(labs) {
    const list = $("lab-list");
    list.replaceChildren();
    labs.forEach((lab) => {
      const li = document.createElement("li");
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = "radio";
      input.name = "lab";
      input.value = lab.name;
      input.addEventListener("change", updateOpen);
      const name = document.createElement("strong");
      name.textContent = lab.name;
      const kind = document.createElement("div");
      kind.className = "kind";
      kind.textContent = (lab.kind === "pod" ? "workspace Pod" : "virtual machine") +
        (lab.nodes > 1 ? ", " + lab.nodes + " machines" : "");
      label.append(input, name, kind);
      if (lab.description) {
        const d = document.createElement("div");
        d.textContent = lab.description;
        label.append(d);
      }
      li.append(label);
      list.append(li);
    });
    updateOpen();
  }

  function chosenLab() {
    const c = document.querySelector('input[name="lab"]:checked');
    return c ? c.value : "";
  }

  function updateOpen() {
    const wait = Math.ceil((state.retryUntil - performance.now()) / 1000);
    const busy = live(state.session) || queued(state.session) || $("open").dataset.busy === "1";
    $("open").disabled = busy || !chosenLab() || wait > 0;
    $("open-note").textContent = wait > 0 ? "you can try again in " + wait + " s" : "";
    // Waiting in line is offered for the lab found full, while chosen.
    const offer = $("wait-offer");
    offer.hidden = !offer.dataset.lab || offer.dataset.lab !== chosenLab() || live(state.session) || queued(state.session);
    $("wait").disabled = busy;
  }

  // offerWait offers to wait in line for lab ("" withdraws the offer).
  function offerWait(lab) {
    $("wait-offer").dataset.lab = lab;
    $("wait-lab").textContent = lab;
    updateOpen();
  }

  // open opens the chosen lab; with wait, a full lab puts the student in
  // line (202 queued) instead of refusing (503 no_capacity), and the
  // refusal of an open without wait offers the line.
  async function open(wait) {
    const body = { lab: chosenLab() };
    const key = $("public-key").value.trim();
    if (key) body.publicKey = key;
    if (wait) body.wait = true;
    $("open").dataset.busy = "1";
    offerWait("");
    showMessage((wait ? "Joining the line for " : "Opening ") + body.lab + "…", "info", "");
    const r = await call("POST", "openSession", body);
    $("open").dataset.busy = "";
    if (r.status === 201 || r.status === 202) {
      showMessage("", "", "");
      state.privateKey = r.data.privateKey || "";
      window.sessionStorage.setItem("labkeep.ownKey." + r.data.id, key ? "1" : "");
      render(r.data, r.received);
    } else {
      // A live session comes with session_exists: show it. The failed
      // row of a refused open says what the error says already.
      if (r.data && live(r.data.session)) render(r.data.session, r.received);
      showError(r);
      if (r.data && r.data.error && r.data.error.code === "no_capacity") offerWait(body.lab);
    }
    updateOpen();
  }

  // leave takes the student out of the line (closeSession while queued).
  async function leave() {
    const s = state.session;
    $("leave").disabled = true;
    const r = await call("POST", "closeSession", { id: s.id }, true);
    $("leave").disabled = false;
    if (r.ok || r.status === 404) {
      state.privateKey = "";
      render(null, r.received);
      showMessage("You left the line for " + s.lab + ".", "info", "left");
    } else {
      showError(r);
      refresh();
    }
  }

  // --- the session -------------------------------------------------------

  async function refresh() {
    window.clearTimeout(state.poll);
    if (!state.token) return;
    const r = await call("GET", "getSession");
    if (r.status === 200) {
      render(r.data, r.received);
    } else if (r.status === 404) {
      const was = state.session;
      render(null, r.received);
      if (queued(was)) {
        showMessage("You are no longer in the line for " + was.lab +
          ": a place nobody keeps asking for is given up. Open the lab again to join the line anew.", "error", "queue_dropped");
      }
    } else if (r.status !== 401) {
      showError(r);
      state.poll = window.setTimeout(refresh, 5000);
    }
  }

  function render(s, received) {
    const was = state.session;
    state.session = s;
    state.anchor = live(s) ? { seconds: secondsLeft(s), at: received } : null;
    show("labs", !live(s) && !queued(s));
    show("session", !!s);
    if (!s) {
      updateOpen();
      notify();
      return;
    }
    if (was && live(was) && was.id === s.id && !live(s)) {
      state.privateKey = "";
    }
    $("session-lab").textContent = s.lab;
    const st = $("session-status");
    st.textContent = s.status;
    st.className = "status " + s.status;
    $("session").dataset.status = s.status;
    $("session").dataset.id = s.id;

    renderQueue(s);
    renderPhases(s);
    renderNodes(s);
    show("machines", !queued(s));
    show("key", (live(s) || queued(s)) && !!state.privateKey);
    $("private-key").textContent = state.privateKey;

    show("clock", live(s));
    show("actions", live(s));
    $("close-what").textContent = s.home && s.home.path
      ? "Its machines and everything on them are deleted, except your home " + s.home.path + ", which stays for your next lab."
      : "Its machines and everything on them are deleted.";
    if (live(s)) {
      setTime($("expires-at"), s.expiresAt);
      setTime($("max-expires-at"), s.maxExpiresAt);
    } else if (queued(s)) {
      show("close-confirm", false);
      show("warning", false);
    } else {
      show("close-confirm", false);
      show("warning", false);
      const text = s.failureReason || (s.status === "expired" ? "the session's time is up" : "");
      if (text) showMessage(text, s.status === "closed" ? "info" : "error", s.status);
    }
    renderExtend(s);
    tick();
    updateOpen();
    notify();
    // Follow provisioning closely; while running, re-read now and then so
    // an ending decided elsewhere (the reaper, an administrator) shows.
    if (live(s)) state.poll = window.setTimeout(refresh, s.status === "provisioning" ? 1500 : 10000);
    // In line, every read is the sign of life that keeps the place (and
    // brings the session once served).
    if (queued(s)) state.poll = window.setTimeout(refresh, queuePollMs);
  }

  // renderQueue shows a queued session's place and the server's ETA.
  function renderQueue(s) {
    const q = $("queue");
    show("queue", queued(s));
    if (!queued(s)) {
      q.dataset.position = "";
      return;
    }
    $("queue-position").textContent = String(s.queuePosition);
    $("queue-eta").textContent = etaText(s);
    q.dataset.position = String(s.queuePosition);
    q.dataset.eta = String(s.etaSeconds);
    q.dataset.etaLatest = String(s.etaLatestSeconds);
    q.dataset.serverTime = s.serverTime;
  }

  function renderPhases(s) {
    show("phases", live(s));
    const nodes = s.nodes || [];
    let reached = 0;
    if (s.status === "running") reached = phases.length;
    else if (nodes.some((n) => n.phase !== "scheduled")) reached = 1;
    $("phases").dataset.phase = phases[Math.min(reached, phases.length - 1)];
    $("phases").querySelectorAll("li").forEach((li, i) => {
      li.className = i < reached ? "done" : i === reached ? "current" : "";
    });
    // A node the cluster cannot place: say which and the scheduler's why.
    const held = live(s) ? nodes.filter((n) => n.phase === "unschedulable") : [];
    show("unschedulable", held.length > 0);
    $("unschedulable-nodes").textContent = held.map((n) => n.name).join(", ");
    $("unschedulable-reason").textContent = held.length ? held[0].phaseReason : "";
  }

  function sshCommand(s, n) {
    const own = window.sessionStorage.getItem("labkeep.ownKey." + s.id) === "1";
    return "ssh " + (own ? "" : "-i labkeep-key ") +
      "-o UserKnownHostsFile=known_hosts -o StrictHostKeyChecking=yes " +
      n.ssh.user + "@" + n.ssh.host + " -p " + n.ssh.port;
  }

  function renderNodes(s) {
    const body = $("nodes").querySelector("tbody");
    body.replaceChildren();
    const lines = [];
    (s.nodes || []).forEach((n, i) => {
      const tr = document.createElement("tr");
      tr.dataset.node = n.name;
      tr.dataset.phase = n.phase;
      const cells = [n.name, n.role, phaseLabel[n.phase] || n.phase].map((t) => {
        const td = document.createElement("td");
        td.textContent = t;
        return td;
      });
      const ssh = document.createElement("td");
      if (live(s) && n.ssh.host) {
        const code = document.createElement("code");
        code.id = "ssh-" + i;
        code.className = "ssh-command";
        code.textContent = sshCommand(s, n);
        const copy = document.createElement("button");
        copy.type = "button";
        copy.className = "copy";
        copy.dataset.copy = code.id;
        copy.textContent = "Copy";
        ssh.append(code, copy);
        if (n.ssh.knownHosts) lines.push(n.ssh.knownHosts);
      } else {
        ssh.textContent = "—";
      }
      tr.append(...cells, ssh);
      body.append(tr);
    });
    $("known-hosts").textContent = lines.join("\n");
    show("ssh-help", live(s) && lines.length > 0);
  }

  function renderExtend(s) {
    const ext = $("extend");
    ext.disabled = !s.extendable;
    let note = "";
    if (live(s) && !s.extendable && s.extendRefusal) {
      note = "Extend is not possible: " + s.extendRefusal + ". The lab ends at " + fmtTime(s.expiresAt) + ".";
    }
    $("extend-note").textContent = note;
  }

  // tick redraws the countdown and the warnings every quarter second.
  function tick() {
    const s = state.session;
    const left = remaining();
    const el = $("remaining");
    if (!live(s) || left === null) {
      el.textContent = "";
      el.dataset.seconds = "";
      return;
    }
    el.textContent = fmtDuration(left);
    el.dataset.seconds = String(left);
    // The warning due is the latest one whose time has come: the server
    // lists them (beforeSeconds), the countdown says when.
    let due = null;
    (s.warnings || []).forEach((w) => {
      if (left > 0 && left <= w.beforeSeconds && (!due || w.beforeSeconds < due.beforeSeconds)) due = w;
    });
    const warn = $("warning");
    if (due) {
      const mins = Math.round(due.beforeSeconds / 60);
      // A home stays: saying where is what makes "save your work" doable.
      const where = s.home && s.home.path ? " in your home " + s.home.path + ", which stays" : "";
      warn.textContent = "Less than " + mins + " minutes left. " + (s.extendable
        ? "Extend the lab or save your work" + where + "."
        : "Save your work" + where + ": the lab ends at " + fmtTime(s.expiresAt) + " and cannot be extended.");
      warn.dataset.before = String(due.beforeSeconds);
    } else {
      warn.dataset.before = "";
    }
    warn.hidden = !due;
    if (left === 0 && state.anchor && !state.anchor.ended) {
      state.anchor.ended = true; // read the ending once
      refresh();
    }
  }

  async function extend() {
    $("extend").disabled = true;
    const r = await call("POST", "extendSession", undefined, true);
    if (r.ok) {
      showMessage("Extended: the lab now ends at " + fmtTime(r.data.expiresAt) + ".", "info", "extended");
      render(r.data, r.received);
    } else {
      showError(r);
      refresh();
    }
  }

  async function closeLab() {
    show("close-confirm", false);
    $("close").disabled = true;
    const r = await call("POST", "closeSession", undefined, true);
    $("close").disabled = false;
    if (r.ok) {
      render(r.data, r.received);
    } else {
      showError(r);
      refresh();
    }
  }

  // --- copy and download -------------------------------------------------

  async function copy(button) {
    const target = $(button.dataset.copy);
    const text = target.textContent;
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = "Copied";
    } catch (e) {
      const range = document.createRange();
      range.selectNodeContents(target);
      const sel = window.getSelection();
      sel.removeAllRanges();
      sel.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    }
  }

  function download(name, text) {
    const url = URL.createObjectURL(new Blob([text + "\n"], { type: "application/octet-stream" }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    window.setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  // --- feature modules ---------------------------------------------------

  function notify() {
    state.listeners.forEach((fn) => {
      try {
        fn(state.session);
      } catch (e) {
        window.console.error(e);
      }
    });
  }

  // window.labkeep is what feature modules build on: call(method, path,
  // body) the API with the student's token, the current session, a
  // callback at every change of it, and the element for their buttons.
  window.labkeep = {
    call: call,
    url: (path) => new URL(path, api).href,
    element: (tag, props) => Object.assign(document.createElement(tag), props),
    token: () => state.token,
    session: () => state.session,
    onSession: (fn) => state.listeners.push(fn),
    features: () => $("features"),
    showError: showError,
    showMessage: showMessage,
  };

  // --- wiring ------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-button").addEventListener("click", () => signIn($("token").value));
    $("signout").addEventListener("click", () => signOut(""));
    $("open").addEventListener("click", () => open(false));
    $("wait").addEventListener("click", () => open(true));
    $("leave").addEventListener("click", leave);
    $("extend").addEventListener("click", extend);
    $("close").addEventListener("click", () => show("close-confirm", true));
    $("close-no").addEventListener("click", () => show("close-confirm", false));
    $("close-yes").addEventListener("click", closeLab);
    $("download-key").addEventListener("click", () => download("labkeep-key", state.privateKey));
    $("download-known-hosts").addEventListener("click", () => download("known_hosts", $("known-hosts").textContent));
    document.addEventListener("click", (ev) => {
      const b = ev.target.closest("button.copy");
      if (b) copy(b);
    });
    window.setInterval(() => {
      tick();
      if (state.retryUntil) updateOpen();
    }, 250);
    if (state.token) signIn(state.token);
    else show("signin", true);
  });
})();
