package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"labkeep/shared/access"
	"labkeep/shared/reap"
)

// HomeKeeper lists students' homes and deletes an unused one
// (reap.Reaper, which owns their retention).
type HomeKeeper interface {
	Homes(ctx context.Context) ([]reap.HomeStatus, error)
	DeleteHome(ctx context.Context, name string) error
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
	list, err := k.Homes(r.Context())
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
	if err := k.DeleteHome(r.Context(), body.Name); err != nil {
		a.writeErrorFor(w, r, access.Principal{Role: access.RoleAdmin}, err, nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": body.Name})
}
