// Command gcagent is an event-sourced garbage collector for containerd
// nodes: it follows containerd's events, keeps a persisted projection of
// images, containers and pods, and cleans what its policy names.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := execute(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gcagent: %v\n", err)
		os.Exit(exitCode(err))
	}
}
