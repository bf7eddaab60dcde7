//go:build testhooks

package node

import "time"

// This file is built only with -tags testhooks (the end-to-end tests'
// builds of the agent): the shipped binary has CallTimeout as a constant
// (calltimeout.go) and no way to change it.

// callTimeout is what bounds a call: CallTimeout unless SetCallTimeout
// changed it.
var callTimeout = CallTimeout

// SetCallTimeout replaces CallTimeout for the clients and calls made after
// it, so that end-to-end tests of a hung containerd wait out seconds, not
// 30 s. It must be called before any client is made; it is not safe for
// concurrent use.
func SetCallTimeout(d time.Duration) { callTimeout = d }
