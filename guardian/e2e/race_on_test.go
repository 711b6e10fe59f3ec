//go:build race

package e2e

// raceEnabled: the tests run under the race detector, so guardian is built
// with it too (its resource figures are then inflated).
const raceEnabled = true
