package redislease

import (
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/lock"
)

// corruptCode starts the error reply of scripts/checks.lua's corrupt().
const corruptCode = "CORRUPT "

// corruptFrom turns a script's "CORRUPT lock|fence <key> holds <what>" reply
// into a *lock.CorruptError; nil for any other error.
func corruptFrom(err error, node, key, fence string) *lock.CorruptError {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return nil
	}
	msg, ok := strings.CutPrefix(rerr.Error(), corruptCode)
	if !ok {
		return nil
	}
	if holds, ok := strings.CutPrefix(msg, "fence "+fence+" holds "); ok && fence != "" {
		return &lock.CorruptError{Node: node, Key: fence, Fence: true, Holds: holds}
	}
	if holds, ok := strings.CutPrefix(msg, "lock "+key+" holds "); ok {
		return &lock.CorruptError{Node: node, Key: key, Holds: holds}
	}
	// A shape this version does not know: keep all Redis said.
	return &lock.CorruptError{Node: node, Key: key, Holds: "(" + msg + ")"}
}
