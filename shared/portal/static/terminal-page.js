// The web terminal page (/portal/terminal?session=ID[&node=NAME], served
// by shared/terminal): xterm.js over labkeep's terminal WebSocket
// (/terminal/connect). The portal's token, from this tab's sessionStorage
// (the portal keeps it there), is the socket's first message — never in
// the URL. Binary messages are terminal bytes both ways; text messages are
// JSON: {"type":"resize",...} from here, {"type":"connected"|"exit",...}
// from labkeep. A refusal closes the socket with 4000 + the HTTP status
// and the reason. Reconnect opens a new socket, which is a new shell.
(() => {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const tokenKey = "labkeep.token"; // portal.js's
  const params = new URLSearchParams(window.location.search);
  const sessionID = params.get("session") || "";
  const node = params.get("node") || "";
  const token = () => window.sessionStorage.getItem(tokenKey) || "";
  const encoder = new TextEncoder();
  let term = null;
  let socket = null;

  function status(text) {
    $("terminal-status").textContent = text;
  }

  function sendSize() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "resize", cols: term.cols, rows: term.rows }));
    }
  }

  function control(m) {
    if (m.type === "connected") {
      $("terminal-node").textContent = m.node ? "— " + m.node : "";
      status("Connected to " + (m.kind === "pod" ? "your workspace container" : "the serial console of") + " " + m.object + ".");
      term.focus();
    } else if (m.type === "exit") {
      status(m.error ? "The terminal ended: " + m.error : "The shell exited (status " + m.exitCode + ").");
    }
  }

  function connect() {
    $("terminal-reconnect").hidden = true;
    if (!sessionID) {
      status("No session given: use the Terminal button of your lab's page.");
      return;
    }
    if (!token()) {
      status("Not signed in: sign in on your lab's page, then use its Terminal button.");
      return;
    }
    const u = new URL("../terminal/connect", window.location.href);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    u.search = "";
    u.searchParams.set("session", sessionID);
    if (node) u.searchParams.set("node", node);
    const ws = new WebSocket(u.href);
    ws.binaryType = "arraybuffer";
    socket = ws;
    status("Connecting…");
    ws.addEventListener("open", () => {
      ws.send(JSON.stringify({ token: token() }));
      sendSize();
    });
    ws.addEventListener("message", (ev) => {
      if (typeof ev.data === "string") {
        try {
          control(JSON.parse(ev.data));
        } catch (e) {
          window.console.error("terminal: bad control message", e);
        }
        return;
      }
      term.write(new Uint8Array(ev.data));
    });
    ws.addEventListener("close", (ev) => {
      if (socket !== ws) return;
      socket = null;
      if (ev.code >= 4000) status("Refused: " + ev.reason);
      else if (!/ended|exited/.test($("terminal-status").textContent)) status("Disconnected.");
      $("terminal-reconnect").hidden = false;
    });
  }

  async function cleanup() {
    const note = $("terminal-cleanup-note");
    $("terminal-cleanup").disabled = true;
    note.textContent = "Cleaning up…";
    let text;
    try {
      const res = await fetch(new URL("../terminal/cleanup", window.location.href), {
        method: "POST", cache: "no-store", credentials: "omit", redirect: "error",
        headers: { Authorization: "Bearer " + token(), "Content-Type": "application/json" },
        body: JSON.stringify({ session: sessionID }),
      });
      const data = await res.json().catch(() => null);
      if (res.ok && data) {
        text = "Killed " + data.killed.length + (data.killed.length === 1 ? " process" : " processes") + (data.failed ? ", " + data.failed + " could not be killed" : "") + ".";
      } else {
        text = "Cleanup failed: " + (data && data.error ? data.error.message : "labkeep answered " + res.status);
      }
    } catch (e) {
      text = "Cleanup failed: cannot reach labkeep: " + e;
    }
    note.textContent = text;
    $("terminal-cleanup").disabled = false;
  }

  document.addEventListener("DOMContentLoaded", () => {
    term = new window.Terminal({ cols: 100, rows: 30, cursorBlink: true, scrollback: 2000 });
    term.open($("terminal"));
    term.onData((d) => {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(d));
    });
    term.onResize(sendSize);
    $("terminal-reconnect").addEventListener("click", () => {
      term.reset();
      connect();
    });
    $("terminal-cleanup").addEventListener("click", cleanup);
    connect();
  });
})();
