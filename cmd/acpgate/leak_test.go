package main

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts must end with it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
