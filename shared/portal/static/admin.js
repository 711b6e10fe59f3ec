// admin.js: labkeep's admin console (admin.html). It reads the admin
// endpoints of its own origin with an admin JWT in the Authorization
// header (kept in sessionStorage, gone with the tab); an instructor's JWT
// gets the class reservations alone (their courses', which the server
// decides): GET /adminStatus
// (capacity, recent reaper runs, sessions failing run after run, the
// waitlist per lab, the warm pool per lab when the server keeps one),
// GET /adminSessions (live sessions), GET /adminAlerts (guardian alerts),
// GET /adminReservations (the week's class reservations, and one day's
// capacity timeline, hour by hour in the admin's own time); and acts with
// POST /adminReapNow (also {"dryRun": true}, a preview), POST
// /closeSession for a student (force-close, after a second click), POST
// /adminReserve (book a class's seats) and POST /adminCancelReservation
// (after a second click).
// Every text shown comes from the server and is set with textContent,
// never as markup: alerts carry what a workspace's user chose.
"use strict";

(function () {
  const api = new URL("..", window.location.href); // the API: the parent of /portal/
  const tokenKey = "labkeep.adminToken";
  const pollMs = 5000;
  const $ = (id) => document.getElementById(id);
  // alertsFor is the session whose alerts the list shows ("" for every
  // session's newest).
  const state = { token: window.sessionStorage.getItem(tokenKey) || "", poll: 0, sessions: {}, alertsFor: "" };

  // call sends one request to the API (labkeepRequest, request.js).
  // again: resend a change the network dropped (a preview and a
  // force-close, whose repetition changes nothing more; never Reap now,
  // which would count as a second run). A token refused (401) signs out;
  // a refused read signs out in refresh, a refused action is said.
  async function call(method, path, body, again) {
    const sent = await window.labkeepRequest(new URL(path, api), method, state.token, body, again);
    if (sent.offline) {
      return { status: 0, ok: false, data: null, offline: sent.offline };
    }
    const res = sent.res;
    if (res.status === 401) {
      signOut(errorText({ status: res.status, data: sent.data }));
    }
    return { status: res.status, ok: res.ok, data: sent.data };
  }

  // errorText is the server's message for a failed answer (request.js).
  const errorText = window.labkeepErrorText;

  function showMessage(text, kind) {
    const m = $("message");
    m.textContent = text;
    m.className = kind || "";
    m.hidden = !text;
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  // danger is a destructive action's button, named by its data attribute
  // key (value: what it acts on); onClick gets the button (see arm).
  function danger(label, key, value, onClick) {
    const b = el("button", label, "danger");
    b.type = "button";
    b.dataset[key] = value;
    b.addEventListener("click", () => onClick(b));
    return b;
  }

  function row(cells) {
    const tr = document.createElement("tr");
    cells.forEach((c) => tr.appendChild(c instanceof Node ? c : el("td", c)));
    return tr;
  }

  function fill(tableId, emptyId, rows) {
    const body = $(tableId).tBodies[0];
    body.replaceChildren.apply(body, rows);
    if (emptyId) $(emptyId).hidden = rows.length > 0;
  }

  function duration(seconds) {
    const s = Math.max(0, Math.floor(seconds));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
    const two = (n) => String(n).padStart(2, "0");
    return (h ? h + ":" + two(m) : String(m)) + ":" + two(r);
  }

  function when(iso) {
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  function counts(c) {
    const parts = Object.keys(c || {}).sort().filter((k) => c[k]).map((k) => k + " " + c[k]);
    return parts.length ? parts.join(", ") : "nothing";
  }

  // --- sign-in ---------------------------------------------------------

  // claims are the token's claims, read only to choose what to show:
  // the server checks every request.
  function claims(token) {
    try {
      return JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))) || {};
    } catch (e) {
      return {};
    }
  }

  // instructor: the console shows only the class reservations.
  function instructor() {
    return claims(state.token).role === "instructor";
  }

  async function signIn(token) {
    state.token = token.trim();
    if (!state.token) {
      showMessage("paste a token first", "error");
      return;
    }
    window.sessionStorage.setItem(tokenKey, state.token);
    const ok = await refresh();
    if (!ok) return;
    $("signin").hidden = true;
    $("who-name").textContent = claims(state.token).sub || "?";
    $("who-role").textContent = instructor() ? "(instructor: your courses' class reservations)" : "";
    $("who").hidden = false;
    $("console").hidden = false;
  }

  function signOut(why) {
    state.token = "";
    window.sessionStorage.removeItem(tokenKey);
    window.clearTimeout(state.poll);
    $("who").hidden = true;
    $("console").hidden = true;
    $("signin").hidden = false;
    showMessage(why || "", why ? "error" : "");
  }

  // --- the picture -----------------------------------------------------

  async function refresh() {
    window.clearTimeout(state.poll);
    const day = shownDay();
    // An instructor reads the reservations alone; the rest is the admin's.
    const admin = !instructor();
    document.querySelectorAll(".admin-part").forEach((p) => { p.hidden = !admin; });
    const skipped = Promise.resolve({ status: 0, ok: true, skipped: true });
    const [st, ss, al, hs, rs, tl] = await Promise.all([admin ? call("GET", "adminStatus") : skipped, admin ? call("GET", "adminSessions") : skipped,
      admin ? call("GET", "adminAlerts?limit=100" + (state.alertsFor ? "&session=" + encodeURIComponent(state.alertsFor) : "")) : skipped,
      admin ? call("GET", "homes?all=true") : skipped, call("GET", "adminReservations"),
      call("GET", "adminReservations?from=" + encodeURIComponent(day.from.toISOString()) + "&to=" + encodeURIComponent(day.to.toISOString()))]);
    if (!state.token) return false;
    const refused = [st, ss, al, hs, rs, tl].find((r) => r.status === 403);
    if (refused) {
      signOut(errorText(refused));
      return false;
    }
    // A server that takes no reservations answers 404: no section then.
    const booking = rs.status !== 404;
    $("reservations-section").hidden = !booking;
    const bad = [st, ss, al, hs].concat(booking ? [rs, tl] : []).find((r) => !r.ok);
    if (bad) {
      showMessage(errorText(bad), "error");
    } else if (!admin && !booking) {
      showMessage("this server books no class reservations", "error");
    } else if ($("message").className === "error") {
      showMessage("", "");
    }
    if (ss.ok && !ss.skipped) renderSessions(ss.data.sessions || []);
    if (st.ok && !st.skipped) renderStatus(st.data);
    if (al.ok && !al.skipped) renderAlerts(al.data.alerts || []);
    if (hs.ok && !hs.skipped) renderHomes(hs.data.homes || []);
    if (rs.ok) renderReservations(rs.data.reservations || []);
    if (tl.ok) renderTimeline(tl.data.timeline || []);
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    state.poll = window.setTimeout(refresh, pollMs);
    return !bad;
  }

  function renderStatus(s) {
    const cap = $("capacity");
    cap.textContent = s.capacity.used + " / " + s.capacity.limit;
    cap.dataset.used = s.capacity.used;
    cap.dataset.limit = s.capacity.limit;
    $("live-sessions").textContent = s.liveSessions;
    $("live-vms").textContent = s.liveVMs;
    $("cluster-error").textContent = s.clusterError ? "cluster: " + s.clusterError : "";
    $("cluster-error").hidden = !s.clusterError;
    renderQueues(s.queues || []);
    renderPools(s.pools || []);
    fill("failing", "no-failing", (s.failingSessions || []).map((f) => {
      const tr = row([el("td", f.session), f.kind, f.runsInARow, el("td", f.lastError, "error")]);
      tr.dataset.session = f.session;
      tr.dataset.runs = f.runsInARow;
      tr.className = "failing";
      return tr;
    }));
    fill("runs", null, (s.recentRuns || []).map((r) => {
      const tr = row([when(r.startedAt), r.trigger + (r.dryRun ? " (dry run)" : ""), counts(r.counts),
        el("td", (r.failures || []).length, (r.failures || []).length ? "bad" : "")]);
      tr.dataset.run = r.id;
      tr.dataset.failures = (r.failures || []).length;
      return tr;
    }));
  }

  // renderQueues lists the labs someone waits for, the longest wait
  // first; labs nobody waits for are left out.
  function renderQueues(list) {
    const waiting = list.filter((q) => q.length > 0).sort((a, b) => b.oldestWaitSeconds - a.oldestWaitSeconds);
    const total = waiting.reduce((n, q) => n + q.length, 0);
    $("waiting-total").textContent = total ? total + " waiting" : "";
    fill("waiting", "no-waiting", waiting.map((q) => {
      const tr = row([q.lab, q.length, duration(q.oldestWaitSeconds)]);
      tr.dataset.lab = q.lab;
      tr.dataset.length = q.length;
      tr.dataset.oldest = q.oldestWaitSeconds;
      return tr;
    }));
  }

  // renderPools shows the warm pool per lab; the section is hidden when
  // the server keeps no pool (no pools field, or an empty one).
  function renderPools(list) {
    $("pools-section").hidden = list.length === 0;
    fill("pools", null, list.map((p) => {
      const tr = row([p.lab, p.target, p.idle, p.starting, p.claimed]);
      tr.dataset.lab = p.lab;
      tr.dataset.idle = p.idle;
      return tr;
    }));
  }

  function renderSessions(list) {
    state.sessions = {};
    fill("sessions", "no-sessions", list.map((s) => {
      state.sessions[s.id] = s;
      const nodes = (s.nodes || []).map((n) => n.name + (n.ready ? " ✓" : " …") + (n.ssh && n.ssh.host ? " " + n.ssh.host : "") +
        (n.phase === "unschedulable" ? " (cannot be placed: " + n.phaseReason + ")" : "")).join(", ");
      const actions = el("td");
      actions.appendChild(danger("Close", "close", s.id, (b) => forceClose(s, b)));
      const count = el("td");
      const show = el("button", s.alerts, "link");
      show.type = "button";
      show.dataset.alertsOf = s.id;
      show.title = "show this session's alerts";
      show.addEventListener("click", () => showAlerts(s.id));
      count.appendChild(show);
      const tr = row([s.student, s.lab, el("td", s.status, "status " + s.status), duration(s.remainingSeconds), nodes, count, actions]);
      tr.dataset.session = s.id;
      tr.dataset.student = s.student;
      tr.dataset.status = s.status;
      return tr;
    }));
  }

  // renderHomes lists every student's home: whose, its group, size, last
  // use, the day the reaper deletes it (in use: none), and Delete for one
  // no session holds.
  function renderHomes(list) {
    fill("homes", "no-homes", list.map((h) => {
      const actions = el("td");
      if (!h.inUse) {
        actions.appendChild(danger("Delete", "deleteHome", h.name, (b) => deleteHome(h, b)));
      }
      const tr = row([h.student || "(unknown)", h.group || "default", h.size, when(h.lastUse),
        h.inUse ? "in use" : h.deleteAt ? when(h.deleteAt) : "kept", actions]);
      tr.dataset.home = h.name;
      return tr;
    }));
  }

  async function deleteHome(h, button) {
    if (arm(button, "Really delete " + (h.student || "this student") + "'s files?")) return;
    const r = await call("POST", "adminDeleteHome", { name: h.name }, true);
    showMessage(r.ok ? "deleted " + (h.student || "") + "'s home " + h.name : errorText(r), r.ok ? "info" : "error");
    await refresh();
  }

  function showAlerts(id) {
    state.alertsFor = id;
    refresh();
  }

  function renderAlerts(list) {
    const s = state.sessions[state.alertsFor];
    $("alerts-filter").hidden = !state.alertsFor;
    $("alerts-of").textContent = state.alertsFor ? (s ? s.student + " — " : "") + state.alertsFor : "";
    $("alerts").dataset.session = state.alertsFor;
    fill("alerts", "no-alerts", list.map((a) => {
      const s = state.sessions[a.session];
      const tr = row([when(a.received), s ? s.student : "", el("td", a.session.slice(0, 8)),
        el("td", a.severity, "severity-" + a.severity), a.kind, el("td", a.subject, "message"), el("td", a.message, "message"), a.count]);
      tr.dataset.session = a.session;
      tr.dataset.kind = a.kind;
      tr.dataset.alert = a.id;
      return tr;
    }));
  }

  // --- reservations ----------------------------------------------------

  // localInput is d as a datetime-local or date input's value, in the
  // browser's own time (the inputs take no zone).
  function localInput(d, dateOnly) {
    const two = (n) => String(n).padStart(2, "0");
    const date = d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate());
    return dateOnly ? date : date + "T" + two(d.getHours()) + ":" + two(d.getMinutes());
  }

  // shownDay is the day the timeline shows (the date input's, today when
  // empty), from its local midnight to the next.
  function shownDay() {
    const input = $("timeline-day");
    if (!input.value) input.value = localInput(new Date(), true);
    const [y, m, d] = input.value.split("-").map(Number);
    return { from: new Date(y, m - 1, d), to: new Date(y, m - 1, d + 1) };
  }

  function clock(iso) {
    const d = new Date(iso);
    return isNaN(d) ? String(iso) : d.toLocaleString([], { weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit" });
  }

  function renderReservations(list) {
    fill("reservations", "no-reservations", list.map((r) => {
      const actions = el("td");
      actions.appendChild(danger("Cancel", "cancelReservation", r.id, (b) => cancelReservation(r, b)));
      const tr = row([r.course, r.lab, r.seats, clock(r.start), clock(r.end), r.bookedBy, actions]);
      tr.dataset.reservation = r.id;
      tr.dataset.course = r.course;
      tr.dataset.lab = r.lab;
      tr.dataset.seats = r.seats;
      tr.dataset.start = r.start;
      tr.dataset.end = r.end;
      return tr;
    }));
  }

  // renderTimeline shows the day an hour a row, a column per capacity
  // bucket: reserved of capacity, what stays free and, in the present
  // hour, what is in use.
  function renderTimeline(slots) {
    const kinds = [], labels = {}, hours = new Map();
    slots.forEach((s) => {
      if (!labels[s.kind]) { kinds.push(s.kind); labels[s.kind] = s.label; }
      if (!hours.has(s.start)) hours.set(s.start, {});
      hours.get(s.start)[s.kind] = s;
    });
    const head = $("timeline").tHead.rows[0];
    head.replaceChildren.apply(head, [el("th", "Hour")].concat(kinds.map((k) => el("th", labels[k]))));
    const now = Date.now();
    fill("timeline", null, Array.from(hours.entries()).map(([start, byKind]) => {
      const first = byKind[kinds.find((k) => byKind[k])];
      const from = new Date(start);
      const cells = [el("td", from.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }))];
      kinds.forEach((k) => {
        const s = byKind[k];
        const td = el("td", "", "slot");
        if (s) {
          td.textContent = s.reserved + " of " + s.capacity + " reserved, " + s.free + " free" + (s.used !== undefined ? " · " + s.used + " in use now" : "");
          const bar = el("div", "", "bar"), fillBar = el("span");
          fillBar.style.width = (s.capacity ? Math.min(100, 100 * s.reserved / s.capacity) : 0) + "%";
          bar.appendChild(fillBar);
          td.appendChild(bar);
          if (s.capacity && s.free === 0) td.classList.add("full");
          td.dataset.kind = k;
          td.dataset.reserved = s.reserved;
          td.dataset.free = s.free;
          td.dataset.capacity = s.capacity;
          if (s.used !== undefined) td.dataset.used = s.used;
        }
        cells.push(td);
      });
      const tr = row(cells);
      tr.dataset.start = start;
      if (from.getTime() <= now && now < new Date(first.end).getTime()) {
        tr.className = "now";
        tr.dataset.now = "true";
      }
      return tr;
    }));
  }

  // reserve books the form's class; the timeline then shows its day.
  async function reserve(ev) {
    ev.preventDefault();
    const start = new Date($("reserve-start").value), end = new Date($("reserve-end").value);
    if (isNaN(start) || isNaN(end)) {
      showMessage("give the class's start and end", "error");
      return;
    }
    const body = { course: $("reserve-course").value.trim(), lab: $("reserve-lab").value.trim(),
      seats: Number($("reserve-seats").value), start: start.toISOString(), end: end.toISOString() };
    $("reserve-button").disabled = true;
    const r = await call("POST", "adminReserve", body);
    $("reserve-button").disabled = false;
    if (!r.ok) {
      showMessage(errorText(r), "error");
      return;
    }
    const b = r.data.reservation;
    showMessage("reserved " + b.seats + " seats of " + b.lab + " for " + b.course + ", " + clock(b.start) + " to " + clock(b.end), "info");
    $("timeline-day").value = localInput(start, true);
    await refresh();
  }

  // cancelReservation asks first, like a force-close.
  async function cancelReservation(r, button) {
    if (arm(button, "Really cancel " + r.course + "'s seats?")) return;
    const c = await call("POST", "adminCancelReservation", { id: r.id });
    showMessage(c.ok ? "cancelled " + r.course + "'s " + r.seats + " seats of " + r.lab + ": free at once" : errorText(c), c.ok ? "info" : "error");
    await refresh();
  }

  // --- actions ---------------------------------------------------------

  // arm asks first: a destructive button's first click arms it (it says
  // what a second click does) and reports true; the second click goes
  // through. (No window.confirm: a modal dialog would stop the polling
  // behind it.)
  function arm(button, question) {
    if (button.dataset.armed === "true") return false;
    button.dataset.armed = "true";
    button.textContent = question;
    window.clearTimeout(state.poll); // keep the armed button on screen
    state.poll = window.setTimeout(refresh, pollMs * 2);
    return true;
  }

  async function reap(body, title) {
    const buttons = [$("reap-now"), $("reap-preview")];
    buttons.forEach((b) => { b.disabled = true; });
    $("reap-note").textContent = "running…";
    const r = await call("POST", "adminReapNow", body, Boolean(body && body.dryRun));
    buttons.forEach((b) => { b.disabled = false; });
    $("reap-note").textContent = "";
    if (!r.ok) {
      showMessage(errorText(r), "error");
      return;
    }
    const rep = r.data;
    $("reap-result-title").textContent = title + (rep.dryRun ? " — dry run, nothing deleted" : "") + " (run " + rep.id + ")";
    $("reap-counts").textContent = (rep.dryRun ? "Would reap: " : "Reaped: ") + counts(rep.counts);
    $("reap-items").replaceChildren.apply($("reap-items"), (rep.items || []).map((i) => el("li", i.kind + " " + i.session + ": " + i.reason)));
    $("reap-failures").replaceChildren.apply($("reap-failures"), (rep.failures || []).map((f) => {
      const li = el("li", f.kind + " " + (f.session || f.object || "") + ": " + f.error);
      li.dataset.session = f.session || "";
      return li;
    }));
    const res = $("reap-result");
    res.dataset.run = rep.id;
    res.dataset.dryRun = rep.dryRun ? "true" : "false";
    res.dataset.failures = (rep.failures || []).length;
    res.hidden = false;
    await refresh();
  }

  // forceClose closes a student's session after a second click (arm).
  async function forceClose(s, button) {
    if (arm(button, "Really close?")) return;
    const r = await call("POST", "closeSession", { student: s.student, id: s.id }, true);
    showMessage(r.ok ? "closed " + s.student + "'s session (" + r.data.status + ")" : errorText(r), r.ok ? "info" : "error");
    await refresh();
  }

  $("signin-button").addEventListener("click", () => signIn($("token").value));
  $("signout").addEventListener("click", () => signOut(""));
  $("reap-now").addEventListener("click", () => reap(undefined, "Reap now"));
  $("reap-preview").addEventListener("click", () => reap({ dryRun: true }, "Preview"));
  $("alerts-all").addEventListener("click", () => showAlerts(""));
  $("reserve-form").addEventListener("submit", reserve);
  $("timeline-day").addEventListener("change", () => refresh());
  // The form starts with the next full hour, for an hour.
  const next = new Date();
  next.setHours(next.getHours() + 1, 0, 0, 0);
  $("reserve-start").value = localInput(next);
  $("reserve-end").value = localInput(new Date(next.getTime() + 3600 * 1000));

  if (state.token) {
    signIn(state.token);
  } else {
    signOut("");
  }
})();
