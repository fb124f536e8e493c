// Command contend takes a session-bound hold on a lock and answers commands on stdin, one
// a line: `held` prints whether it is still held, `await-loss` waits until it is not (and
// says why), `release` releases it and exits. End of input exits without releasing (the
// process's end lets go). A refused acquire prints `error CODE` and exits 3.
//
// Usage: contend LOCK WAIT_SECONDS  (the sidecar at $LEASEHOLD_URL)
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	leasehold "leasehold.dev/client"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: contend LOCK WAIT_SECONDS")
		os.Exit(2)
	}
	wait, err := strconv.ParseFloat(os.Args[2], 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "WAIT_SECONDS: %v\n", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(wait*float64(time.Second))+30*time.Second)
	defer cancel()
	hold, err := leasehold.New().Acquire(ctx, os.Args[1], leasehold.WithWait(time.Duration(wait*float64(time.Second))))
	var refused *leasehold.Error
	if errors.As(err, &refused) {
		fmt.Printf("error %s\n", refused.Code)
		os.Exit(3)
	} else if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("granted %d %t\n", hold.Token(), hold.Held())
	commands := bufio.NewScanner(os.Stdin)
	for commands.Scan() {
		switch commands.Text() {
		case "held":
			fmt.Printf("held %t\n", hold.Held())
		case "await-loss":
			<-hold.Lost()
			var lost *leasehold.LostError
			errors.As(hold.Err(), &lost)
			fmt.Printf("lost %t %s\n", hold.Held(), lost.Reason)
		case "release":
			if err := hold.Release(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			fmt.Printf("released %t\n", hold.Held())
			return
		default:
			fmt.Fprintf(os.Stderr, "unknown command %q\n", commands.Text())
			os.Exit(2)
		}
	}
}
