// The student's homes on the student page (a feature module, see
// portal.js's window.labkeep): what stays when a lab ends. For a session
// that holds a home it says where the home is mounted; while the session
// runs, "Download your home" saves it as a .tar.gz (GET /homeArchive:
// labkeep streams it from the running workspace and stores it nowhere;
// the page holds it in memory until it is saved). Every home of the
// student is listed with its size and, while no session holds it, the day
// labkeep deletes it unless a lab uses it before (GET /homes) and a
// "Download" of its own (labkeep reads it with a short-lived Pod); a VM
// lab's home holds the VM's disk, and has none.
(() => {
  "use strict";

  function day(iso) {
    return new Date(iso).toLocaleDateString(undefined, { year: "numeric", month: "long", day: "numeric" });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const lk = window.labkeep;
    if (!lk) return;
    const element = lk.element;
    const box = element("div", { id: "home", className: "home", hidden: true });
    const where = element("p", { id: "home-where" });
    const download = element("button", { type: "button", id: "home-download", textContent: "Download your home" });
    const note = element("span", { id: "home-note", className: "note" });
    const actions = element("p", {});
    actions.append(download, " ", note);
    const list = element("ul", { id: "home-list" });
    box.append(element("h3", { textContent: "Your home" }), where, actions, list);
    lk.features().appendChild(box);

    let listed = "";
    let homes = 0; // how many homes the last list showed
    async function listHomes() {
      const r = await lk.call("GET", "homes");
      if (!r.ok || !r.data) return;
      homes = r.data.homes.length;
      box.hidden = box.hidden && homes === 0;
      list.replaceChildren();
      r.data.homes.forEach((h) => {
        const li = element("li", {});
        li.dataset.name = h.name;
        li.textContent = (h.group ? h.group : "your home") + ", " + h.size + ": " +
          (h.inUse ? "in use" : h.deleteAt ? "kept until " + day(h.deleteAt) + " unless a lab uses it before" : "kept");
        const vmHome = h.group === "vm" || (h.group || "").startsWith("vm-");
        if (!h.inUse && !vmHome) {
          const b = element("button", { type: "button", className: "home-save", textContent: "Download" });
          b.addEventListener("click", () => save(h.name, b));
          li.append(" ", b);
        }
        list.append(li);
      });
    }

    lk.onSession((s) => {
      const home = s && s.home;
      box.hidden = !home && homes === 0;
      where.textContent = home && home.path
        ? "Your files under " + home.path + " stay when this lab ends; everything else is deleted."
        : "";
      download.hidden = !home || s.status !== "running" || s.kind !== "pod";
      download.dataset.name = home ? home.name : "";
      // The list changes when a session starts or ends.
      const key = s ? s.id + " " + s.status : "";
      if (key !== listed) {
        listed = key;
        listHomes();
      }
    });

    // save downloads home name as a .tar.gz, button disabled meanwhile.
    async function save(name, button) {
      if (!name) return;
      button.disabled = true;
      note.textContent = "Preparing the archive…";
      try {
        const u = new URL(lk.url("homeArchive"));
        u.searchParams.set("name", name);
        const res = await fetch(u, { headers: { Authorization: "Bearer " + lk.token() } });
        if (!res.ok) {
          const body = await res.json().catch(() => null);
          note.textContent = "Download failed: " + (body && body.error ? body.error.message : "labkeep answered " + res.status);
          return;
        }
        const blob = await res.blob();
        const url = URL.createObjectURL(blob);
        const a = element("a", { href: url, download: name + ".tar.gz" });
        document.body.append(a);
        a.click();
        a.remove();
        window.setTimeout(() => URL.revokeObjectURL(url), 10000);
        note.textContent = "Saved " + name + ".tar.gz (" + blob.size + " bytes).";
      } catch (e) {
        note.textContent = "Download failed: " + e;
      } finally {
        button.disabled = false;
      }
    }

    download.addEventListener("click", () => save(download.dataset.name, download));
  });
})();
