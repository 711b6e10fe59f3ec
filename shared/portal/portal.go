// Package portal is the student's web page, served by labkeep itself under
// Prefix (/portal/) beside the session functions it calls: plain HTML, CSS
// and JavaScript with no build step, embedded from static/.
//
// The page talks to the API of the same origin only (the parent of
// Prefix: /getSession, /openSession, …) with the portal's JWT in the
// Authorization header — never a cookie, so another site cannot make a
// student's browser act for them (no CSRF). The student pastes the token
// (make run prints one); it is kept in sessionStorage, gone with the tab.
//
// Every file is served with a strict Content-Security-Policy
// (ContentSecurityPolicy: scripts, styles and connections from this origin
// only, no inline script or style, no framing), X-Content-Type-Options:
// nosniff and no referrer, so the page's JavaScript must live in files
// and set no style attribute from markup.
//
// Layout of static/, one file per concern so features stay apart:
//
//	index.html   the student page; loads portal.css and portal.js, and
//	             the feature modules listed at its end (one <script src>
//	             each, in the marked hook)
//	portal.css   its styles
//	portal.js    sign-in, the lab list, open, the session view (phases,
//	             nodes, SSH, countdown, warnings, extend, close) and the
//	             error messages; it exposes window.labkeep (call, token,
//	             session, onSession, features, showError, showMessage)
//	             for feature modules
//	request.js   the one way portal.js and admin.js send a request
//	             (token, no cache, JSON decoding, resend of what the
//	             network dropped when safe) and word a failed answer;
//	             index.html and admin.html load it first
//	<feature>.js a feature module (e.g. a web terminal) adds its own file
//	             and its button in the hook of index.html; a page of its
//	             own (e.g. admin.html) sits beside index.html
//
// Handlers that belong under the portal (a terminal's WebSocket) are added
// with Portal.Handle.
package portal

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

// Prefix is where the portal is served.
const Prefix = "/portal/"

// DefaultEnabled is whether labkeep serves the portal unless told
// otherwise (LABKEEP_PORTAL).
const DefaultEnabled = true

// ContentSecurityPolicy is sent with every portal response: everything
// from this origin only, nothing inline, never in a frame.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

//go:embed static
var files embed.FS

// Static is the page's files (static/ at the root).
func Static() fs.FS {
	sub, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // static/ is embedded: it exists
	}
	return sub
}

// Portal serves the page and the handlers added under Prefix.
type Portal struct {
	mux *http.ServeMux
}

// New returns the portal serving the embedded files.
func New() *Portal {
	p := &Portal{mux: http.NewServeMux()}
	files := http.StripPrefix(Prefix, http.FileServerFS(Static()))
	p.mux.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		files.ServeHTTP(w, r)
	})
	return p
}

// Handle serves h at Prefix+path (path without a leading slash, e.g.
// "terminal"), behind the portal's security headers.
func (p *Portal) Handle(path string, h http.Handler) {
	p.mux.Handle(Prefix+strings.TrimPrefix(path, "/"), h)
}

// ServeHTTP serves a request under Prefix with the security headers.
func (p *Portal) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
	p.mux.ServeHTTP(w, r)
}

// Mount returns a handler serving the portal's files and handlers under
// Prefix (and /portal redirected there) and everything else, including
// other paths under Prefix, with next (so a handler mounted beside the
// portal may serve under it too).
func (p *Portal) Mount(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case p.serves(r):
			p.ServeHTTP(w, r)
		case r.URL.Path == strings.TrimSuffix(Prefix, "/"):
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// serves reports whether r is for one of the portal's files or handlers.
func (p *Portal) serves(r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, Prefix) {
		return false
	}
	if _, pattern := p.mux.Handler(r); pattern != Prefix {
		return pattern != ""
	}
	name := strings.TrimPrefix(r.URL.Path, Prefix)
	if name == "" {
		return true
	}
	_, err := fs.Stat(Static(), name)
	return err == nil
}
