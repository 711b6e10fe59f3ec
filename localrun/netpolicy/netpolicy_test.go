package netpolicy

import "testing"

// refusal finds the engine's report of a refused rule sync or queue, with
// the whole of a multi-line klog error, and nothing in a clean start.
func TestRefusal(t *testing.T) {
	tests := []struct {
		name, log, want string
	}{
		{"clean start", "I1201 controller.go:710] \"Syncing nftables rules\"\nI1201 controller.go:380] \"Waiting for informer caches to sync\"\n", ""},
		{"refused rules, multi-line error",
			"I1201 controller.go:710] \"Syncing nftables rules\"\nI1201 controller.go:925] \"syncing nftables rules\" error=<\n\tconn.Receive: netlink receive: no such file or directory\n >\nI1201 next\n",
			"I1201 controller.go:925] \"syncing nftables rules\" error=< conn.Receive: netlink receive: no such file or directory"},
		{"refused queue", "I1201 controller.go:461] \"could not open nfqueue socket\" error=\"operation not permitted\"\n",
			"I1201 controller.go:461] \"could not open nfqueue socket\" error=\"operation not permitted\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := refusal(tc.log); got != tc.want {
				t.Errorf("refusal = %q, want %q", got, tc.want)
			}
		})
	}
}
