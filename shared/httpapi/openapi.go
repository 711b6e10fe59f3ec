package httpapi

import (
	_ "embed"
	"maps"
	"net/http"
)

// OpenAPI is the OpenAPI 3 description of every route the session
// functions serve (openapi.yaml): served at GET /openapi.yaml, so a client
// can be generated from a running deployment, and checked against the
// real handlers by test/openapi, which fails when an answer drifts from it.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Routes returns every path the API serves with its only method: the
// session API's, WithReaper's and WithAdmin's (/metrics only where a
// Gatherer is given). The description must document each of them.
func Routes() map[string]string {
	all := maps.Clone(routes)
	maps.Copy(all, reaperRoutes)
	maps.Copy(all, adminRoutes)
	return all
}

// openapi serves OpenAPI, unauthenticated: the description is public.
func (a *API) openapi(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(OpenAPI)
}
