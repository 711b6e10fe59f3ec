package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"labkeep/shared/access"
	"labkeep/shared/labs"
	"labkeep/shared/reap"
	"labkeep/shared/session"
)

// HomeKeeper lists students' homes and deletes an unused one
// (reap.Reaper, which owns their retention).
type HomeKeeper interface {
	HomeStatuses(ctx context.Context) ([]reap.HomeStatus, error)
	DeleteUnusedHome(ctx context.Context, name string) error
}

// homes serves GET /homes: a student's own homes (?student= for an
// admin acting for one), or with ?all=true every home of the
// environment, for an admin; each with its size, last use and when the
// reaper deletes it.
func (a *API) homes(w http.ResponseWriter, r *http.Request, k HomeKeeper) {
	p, ok := a.Authenticate(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	for key := range q {
		if key != "student" && key != "all" {
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: unknown query parameter %q (allowed: student, all)", access.ErrBadRequest, key), nil)
			return
		}
	}
	all := q.Get("all") == "true"
	if q.Has("all") && !all && q.Get("all") != "false" {
		a.writeErrorFor(w, r, p, fmt.Errorf("%w: all must be true or false", access.ErrBadRequest), nil)
		return
	}
	if all && !p.Admin() {
		a.writeErrorFor(w, r, p, fmt.Errorf("%w: every home is for admins; a student sees their own", access.ErrForbidden), nil)
		return
	}
	student, err := actingFor(p, q.Get("student"))
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	list, err := k.HomeStatuses(r.Context())
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	out := []reap.HomeStatus{}
	for _, h := range list {
		if all || h.Student == student {
			out = append(out, h)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"homes": out})
}

// adminDeleteHome serves POST /adminDeleteHome {"name": …}: an admin
// deletes a home no session holds (404 no_home, 409 home_in_use).
func (a *API) adminDeleteHome(w http.ResponseWriter, r *http.Request, k HomeKeeper) {
	if !a.admin(w, r) {
		return
	}
	var body struct {
		Name string `json:"name"`
	}
	if err := decodeBody(w, r, &body, true); err != nil {
		a.writeError(w, r, err, nil)
		return
	}
	if body.Name == "" {
		a.writeError(w, r, fmt.Errorf("%w: name is required", access.ErrBadRequest), nil)
		return
	}
	if err := k.DeleteUnusedHome(r.Context(), body.Name); err != nil {
		a.writeErrorFor(w, r, access.Principal{Role: access.RoleAdmin}, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": body.Name})
}

// HomeArchiver streams the home a running session holds as a gzipped
// tar (kube.Cluster).
type HomeArchiver interface {
	ArchiveHome(ctx context.Context, s session.Session, w io.Writer) error
}

// homeArchive serves GET /homeArchive?name=…: the caller's own home as a
// gzipped tar, streamed from the running pod lab session that holds it
// (409 not_running without one). Another's home, or one that does not
// exist, is 403: whose homes exist is nobody else's business. A vm lab's
// home holds a disk image, not files: 400.
func (a *API) homeArchive(w http.ResponseWriter, r *http.Request, k HomeKeeper, z HomeArchiver) {
	p, ok := a.Authenticate(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	for key := range q {
		if key != "name" {
			a.writeErrorFor(w, r, p, fmt.Errorf("%w: unknown query parameter %q (allowed: name)", access.ErrBadRequest, key), nil)
			return
		}
	}
	name := q.Get("name")
	if name == "" {
		a.writeErrorFor(w, r, p, fmt.Errorf("%w: name is required", access.ErrBadRequest), nil)
		return
	}
	// The caller's own running session holding the home is all a
	// download needs to know; only without one are the homes listed, to
	// say why not.
	st, err := a.svc.Get(r.Context(), p.Subject, "")
	if err != nil && !errors.Is(err, session.ErrNoSession) {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	vmHome := fmt.Errorf("%w: a VM lab's home holds the VM's disk; copy your files from inside the VM", access.ErrBadRequest)
	if st.Session == nil || st.Session.Home != name {
		list, err := k.HomeStatuses(r.Context())
		if err != nil {
			a.writeErrorFor(w, r, p, err, nil)
			return
		}
		i := slices.IndexFunc(list, func(h reap.HomeStatus) bool { return h.Name == name && h.Student == p.Subject })
		switch {
		case i < 0:
			err = fmt.Errorf("%w: %q is not one of your homes", access.ErrForbidden, name)
		case list[i].Group == "vm" || strings.HasPrefix(list[i].Group, "vm-"):
			err = vmHome
		default:
			err = fmt.Errorf("%w: open a lab that keeps this home, then download it while it runs", session.ErrNotRunning)
		}
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	if st.Session.Kind == labs.KindVM {
		a.writeErrorFor(w, r, p, vmHome, nil)
		return
	}
	// The archive is streamed as tar writes it: once the first bytes are
	// out the status is 200, and a failure later cuts the stream short,
	// which the client sees as a broken archive.
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name+".tar.gz"))
	cw := &commitWriter{w: w}
	if err := z.ArchiveHome(r.Context(), *st.Session, cw); err != nil {
		if !cw.started {
			w.Header().Del("Content-Disposition")
			a.writeErrorFor(w, r, p, err, st.Session)
			return
		}
		a.log.Warn("home archive cut short", "home", name, "err", err)
	}
}

// commitWriter writes to an http.ResponseWriter, remembering whether
// anything was written (the status is then sent).
type commitWriter struct {
	w       http.ResponseWriter
	started bool
}

func (c *commitWriter) Write(b []byte) (int, error) {
	c.started = true
	return c.w.Write(b)
}
