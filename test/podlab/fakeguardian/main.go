// Command fakeguardian is what a workspace's root can put in guardian's
// place: having killed guardian, it holds guardian's port in the Pod's
// network namespace while the kubelet restarts guardian, and answers the
// functions' cleanup call itself. test/podlab copies it into a real
// workspace Pod to show what that gains: the Authorization header it
// receives (written to -record, one line per request) and the redirect it
// may answer (a 307 to the URL in -redirect-file, when that file is not
// empty; else a cleanup report that killed nothing).
//
// It binds -listen, retrying until guardian's socket is gone, prints
// "listening" once bound, answers every other path with "fakeguardian"
// (so a caller can tell it from guardian) and exits after -for.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	listen := flag.String("listen", ":9090", "guardian's API address")
	record := flag.String("record", "/tmp/fakeguardian.auth", "file each /cleanup request's Authorization header is appended to")
	redirectFile := flag.String("redirect-file", "/tmp/fakeguardian.redirect", "file whose URL, when not empty, /cleanup redirects to")
	life := flag.Duration("for", 3*time.Minute, "how long to hold the port")
	flag.Parse()

	var ln net.Listener
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if ln, err = net.Listen("tcp", *listen); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("binding %s: %v", *listen, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	fmt.Println("listening")
	time.AfterFunc(*life, func() { os.Exit(0) })

	mux := http.NewServeMux()
	mux.HandleFunc("/cleanup", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.OpenFile(*record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintln(f, r.Header.Get("Authorization"))
			f.Close()
		}
		if b, _ := os.ReadFile(*redirectFile); strings.TrimSpace(string(b)) != "" {
			http.Redirect(w, r, strings.TrimSpace(string(b)), http.StatusTemporaryRedirect)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintln(w, `{"killed":[],"failed":0}`)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "fakeguardian") })
	log.Fatal(http.Serve(ln, mux))
}
