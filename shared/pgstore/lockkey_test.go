package pgstore

import (
	"hash/fnv"
	"testing"
)

// Lock keys are pure: that two environments on one database never share a
// capacity or reaper lock is a property of the key alone.
func TestLockKeyEnvironments(t *testing.T) {
	tests := []struct {
		name       string
		envA, lckA string
		envB, lckB string
		same       bool
	}{
		{"same environment and name share a lock", "prod", "reaper", "prod", "reaper", true},
		{"another environment's reaper lock differs", "prod", "reaper", "staging", "reaper", false},
		{"another environment's capacity lock differs", "prod", "capacity", "staging", "capacity", false},
		{"another name in one environment differs", "prod", "reaper", "prod", "capacity", false},
		{"an environment's lock is not the database-wide one", "prod", "migrate", "", "migrate", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := lockKey(tt.envA, tt.lckA), lockKey(tt.envB, tt.lckB)
			if (a == b) != tt.same {
				t.Errorf("lockKey(%q, %q) = %d, lockKey(%q, %q) = %d; want same = %v", tt.envA, tt.lckA, a, tt.envB, tt.lckB, b, tt.same)
			}
		})
	}
}

// The database-wide migration lock keeps the key every earlier labkeep
// used, so an old and a new instance starting together never migrate at
// once.
func TestMigrateLockKeyUnchanged(t *testing.T) {
	h := fnv.New64a()
	h.Write([]byte("labkeep:migrate"))
	if got, want := lockKey("", "migrate"), int64(h.Sum64()); got != want {
		t.Errorf("migration lock key = %d, want %d", got, want)
	}
}
