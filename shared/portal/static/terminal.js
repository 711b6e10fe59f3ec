// The web terminal's buttons on the student page (a feature module, see
// portal.js's window.labkeep): for a running session, "Open terminal"
// goes to the terminal page (/portal/terminal?session=ID, served by
// shared/terminal: a shell through Kubernetes, without SSH), and for a
// workspace Pod session "Clean up processes" asks the Pod's guardian, via
// POST /terminal/cleanup, to kill every process it does not protect, and
// shows how many went. The token stays in this tab's sessionStorage, which
// the terminal page (same tab) reads.
(() => {
  "use strict";

  document.addEventListener("DOMContentLoaded", () => {
    const lk = window.labkeep;
    if (!lk) return;
    const element = lk.element;
    const box = element("div", { id: "terminal-actions", className: "actions", hidden: true });
    const open = element("button", { type: "button", id: "terminal-open", textContent: "Open terminal" });
    const clean = element("button", { type: "button", id: "terminal-cleanup", className: "danger", textContent: "Clean up processes" });
    const note = element("span", { id: "terminal-note", className: "note" });
    box.append(open, " ", clean, " ", note);
    lk.features().appendChild(box);

    lk.onSession((s) => {
      const running = !!s && s.status === "running";
      box.hidden = !running;
      clean.hidden = !running || s.kind !== "pod";
    });

    open.addEventListener("click", () => {
      const s = lk.session();
      if (!s) return;
      const u = new URL("terminal", window.location.href);
      u.searchParams.set("session", s.id);
      window.location.assign(u.href);
    });

    clean.addEventListener("click", async () => {
      const s = lk.session();
      if (!s) return;
      clean.disabled = true;
      note.textContent = "Cleaning up…";
      const r = await lk.call("POST", "terminal/cleanup", { session: s.id });
      clean.disabled = false;
      if (r.ok && r.data) {
        note.textContent = "Killed " + r.data.killed.length + (r.data.killed.length === 1 ? " process" : " processes") +
          (r.data.failed ? ", " + r.data.failed + " could not be killed" : "") + (r.data.note ? " (" + r.data.note + ")" : "") + ".";
      } else {
        const err = r.data && r.data.error;
        note.textContent = "Cleanup failed: " + (err ? err.message : "labkeep answered " + r.status);
      }
    });
  });
})();
