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

// HomeArchiver streams a student's home as a gzipped tar (kube.Cluster):
// from the running session that holds it, or, while no session holds it,
// through a reader of its own.
type HomeArchiver interface {
	ArchiveHome(ctx context.Context, s session.Session, w io.Writer) error
	ArchiveIdleHome(ctx context.Context, student, name string, w io.Writer) error
}

// homeArchive serves GET /homeArchive?name=…: the caller's own home as a
// gzipped tar, streamed from the running pod lab session that holds it,
// or, while no session holds it, read by a Pod of its own for the
// download. Another's home, or one that does not exist, is 403: whose
// homes exist is nobody else's business. A vm lab's home holds a disk
// image, not files: 400. A session of the caller that holds it but is not
// running yet is 409 not_running; a home being deleted, or already being
// downloaded through a reader, 409 home_busy.
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
	// The caller's own live session holding the home is all a download
	// from a running lab needs to know; only without one are the homes
	// listed.
	st, err := a.svc.Get(r.Context(), p.Subject, "")
	if err != nil && !errors.Is(err, session.ErrNoSession) {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	holds := st.Session != nil && st.Session.Status.Live() && st.Session.Home == name
	vmHome := fmt.Errorf("%w: a VM lab's home holds the VM's disk; copy your files from inside the VM", access.ErrBadRequest)
	var archive func(io.Writer) error
	var holder *session.Session // the session archived from, for the error
	switch {
	case holds && st.Session.Kind == labs.KindVM:
		err = vmHome
	case holds:
		holder = st.Session
		archive = func(w io.Writer) error { return z.ArchiveHome(r.Context(), *holder, w) }
	default:
		list, lerr := k.HomeStatuses(r.Context())
		if lerr != nil {
			a.writeErrorFor(w, r, p, lerr, nil)
			return
		}
		i := slices.IndexFunc(list, func(h reap.HomeStatus) bool { return h.Name == name && h.Student == p.Subject })
		switch {
		case i < 0:
			err = fmt.Errorf("%w: %q is not one of your homes", access.ErrForbidden, name)
		case list[i].Group == "vm" || strings.HasPrefix(list[i].Group, "vm-"):
			err = vmHome
		case list[i].InUse:
			// A session of the caller's that is ending, between the
			// session read above and the list.
			err = fmt.Errorf("%w: a session still holds this home; try again in a moment", session.ErrHomeBusy)
		default:
			archive = func(w io.Writer) error { return z.ArchiveIdleHome(r.Context(), p.Subject, name, w) }
		}
	}
	if err != nil {
		a.writeErrorFor(w, r, p, err, nil)
		return
	}
	// The archive is streamed as tar writes it: once the first bytes are
	// out the status is 200, and a failure later cuts the stream short,
	// which the client sees as a broken archive.
	w.Header().Set("Content-Type", "application/gzip")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name+".tar.gz"))
	cw := &commitWriter{w: w}
	if err := archive(cw); err != nil {
		if !cw.started {
			w.Header().Del("Content-Disposition")
			a.writeErrorFor(w, r, p, err, holder)
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
