// Command pause is the local node's sandbox ("pause") container and the
// stand-in for every container that only has to exist: the anchor Job's. It
// does what registry.k8s.io/pause does — sleeps until SIGTERM or SIGINT and
// then exits 0, and reaps every orphan while it is PID 1 of a Pod's shared
// PID namespace — at the cost of one sleeping process.
package main

import "labkeep/localrun/images/pid1"

func main() { pid1.Wait() }
