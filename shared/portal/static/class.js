// The student's classes on the student page (a feature module, see
// portal.js's window.labkeep): the reservations of their courses (GET
// /reservations), each saying which lab is reserved and when. From its
// start until its seats are released, "Open <lab>" opens the class's lab
// through the page's own Open (a member's open takes a reserved seat,
// ahead of the line); before that it says when. The times are the
// server's: the page counts from the serverTime of its last read
// (performance.now(), immune to the computer's clock) and reads again
// every classPollMs and when a class's start comes.
(() => {
  "use strict";

  const classPollMs = 15000;

  function clock(iso) {
    return new Date(iso).toLocaleTimeString(undefined, { hour: "2-digit", minute: "2-digit" });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const lk = window.labkeep;
    if (!lk) return;
    const element = lk.element;
    const box = element("div", { id: "classes", className: "classes", hidden: true });
    const list = element("ul", { id: "class-list" });
    box.append(element("h3", { textContent: "Your classes" }), list);
    // Beside the lab list, where a student without a lab opens one.
    document.getElementById("labs").appendChild(box);

    let classes = [];
    let served = null; // { at: server time (ms), mono: performance.now() } of the last read
    const serverNow = () => (served ? served.at + (performance.now() - served.mono) : Date.now());

    async function read() {
      if (!lk.token()) return;
      const r = await lk.call("GET", "reservations");
      if (!r.ok || !r.data) return;
      served = { at: Date.parse(r.data.serverTime), mono: performance.now() };
      classes = r.data.reservations;
      render();
    }

    function openClass(lab) {
      const radio = document.querySelector('input[name="lab"][value="' + CSS.escape(lab) + '"]');
      if (!radio) {
        lk.showMessage("Lab " + lab + " is not in your catalog.", "error", "");
        return;
      }
      // As if the student chose it: the page's Open follows the choice.
      radio.checked = true;
      radio.dispatchEvent(new Event("change", { bubbles: true }));
      document.getElementById("open").click();
    }

    function render() {
      box.hidden = classes.length === 0;
      const now = serverNow();
      const s = lk.session();
      const busy = s && (s.status === "provisioning" || s.status === "running" || s.status === "queued");
      list.replaceChildren();
      classes.forEach((c) => {
        const li = element("li", {});
        li.dataset.course = c.course;
        li.dataset.lab = c.lab;
        li.textContent = c.course + ": lab " + c.lab + " reserved from " + clock(c.start) + " to " + clock(c.end) + " ";
        const b = element("button", { type: "button", className: "class-open", textContent: "Open " + c.lab });
        const open = now >= Date.parse(c.start) && now < Date.parse(c.heldUntil);
        b.disabled = !open || busy;
        if (!open) {
          b.title = now < Date.parse(c.start) ? "Opens at " + clock(c.start) : "Your class's seats were released; open it from the list above";
        }
        b.addEventListener("click", () => openClass(c.lab));
        li.append(b);
        list.append(li);
      });
    }

    lk.onSession(() => {
      if (!served) read();
      else render();
    });
    window.setInterval(read, classPollMs);
    // A class's start: render (and read) as it comes.
    window.setInterval(() => {
      const now = serverNow();
      if (classes.some((c) => Math.abs(Date.parse(c.start) - now) < 1000)) read();
      else render();
    }, 1000);
  });
})();
