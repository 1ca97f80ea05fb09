package lock

import (
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// CorruptError says that a lock key or fence counter holds something the
// scripts cannot have written, where, and how to repair it. It matches
// ErrCorrupt. The scripts refuse before their first write, so the key at
// fault and the lock's other key are left as they were.
type CorruptError struct {
	Node  string // the Redis the key was found on
	Key   string // the key at fault
	Fence bool   // Key is the fence counter; otherwise the lock key
	Holds string // what Key holds: a type ("a hash") or a value cut to 64 bytes
}

func (e *CorruptError) Error() string {
	what := "lock key"
	if e.Fence {
		what = "fence counter"
	}
	return fmt.Sprintf("%v: %s %s on %s holds %s; %s", ErrCorrupt, what, e.Key, e.Node, e.Holds, e.Fix())
}

// Fix is the operator's repair, to show beside the error.
func (e *CorruptError) Fix() string {
	if e.Fence {
		return "delete " + e.Key + ": the next acquisition restores the counter from the floor"
	}
	return "delete " + e.Key + ": a lease is a string with an expiry, and the next acquisition writes one"
}

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// corruptCode starts the error reply of scripts/checks.lua's corrupt().
const corruptCode = "CORRUPT "

// corruptFrom turns a script's "CORRUPT lock|fence <key> holds <what>" reply
// into a *CorruptError; nil for any other error.
func corruptFrom(err error, node, key, fence string) *CorruptError {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return nil
	}
	msg, ok := strings.CutPrefix(rerr.Error(), corruptCode)
	if !ok {
		return nil
	}
	if holds, ok := strings.CutPrefix(msg, "fence "+fence+" holds "); ok && fence != "" {
		return &CorruptError{Node: node, Key: fence, Fence: true, Holds: holds}
	}
	if holds, ok := strings.CutPrefix(msg, "lock "+key+" holds "); ok {
		return &CorruptError{Node: node, Key: key, Holds: holds}
	}
	// A shape this version does not know: keep all Redis said.
	return &CorruptError{Node: node, Key: key, Holds: "(" + msg + ")"}
}
