package lock

import (
	"fmt"
	"math"
	"time"
)

// Defaults applied to zero Options fields.
const (
	DefaultWait          = 5 * time.Second
	DefaultRetryInterval = 50 * time.Millisecond
)

// Options configure one acquisition.
type Options struct {
	// TTL of the lease. Required.
	TTL time.Duration
	// Wait bounds Acquire even when ctx has no deadline. Zero means DefaultWait.
	Wait time.Duration
	// RetryInterval between attempts while waiting; a random jitter of up to the
	// same again is added. Zero means DefaultRetryInterval.
	RetryInterval time.Duration
	// RenewInterval of the watchdog. Zero means TTL/3; negative disables the
	// watchdog (the lock then lives for one TTL unless Extend is called).
	RenewInterval time.Duration
	// SafetyMargin is subtracted from the local trust deadline on top of the
	// clock drift. Zero means TTL/10.
	SafetyMargin time.Duration
	// Floor is the highest token already accepted downstream; the issued token
	// is always greater.
	Floor int64
	// Instance names the acquiring process for operators (a host or pod
	// name). The backend records it beside the owner and reports it in
	// Holder and HolderError; "" records none.
	Instance string
	// Waiting, if set, is called once per Acquire, when its first attempt
	// finds the lock held by another owner and the wait begins.
	Waiting func(holder *HolderError)
}

// WithDefaults checks o and fills its zero fields; every backend applies it
// first, so all of them read Options alike.
func (o Options) WithDefaults() (Options, error) {
	if o.TTL <= 0 {
		return o, fmt.Errorf("lock: TTL must be positive, got %s", o.TTL)
	}
	if o.Floor == math.MaxInt64 {
		return o, fmt.Errorf("lock: Floor %d leaves no token above it", o.Floor)
	}
	// Tokens start at 1: a negative floor lifts nothing.
	o.Floor = max(o.Floor, 0)
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = DefaultRetryInterval
	}
	if o.RenewInterval == 0 {
		o.RenewInterval = o.TTL / 3
	}
	if o.SafetyMargin <= 0 {
		o.SafetyMargin = o.TTL / 10
	}
	return o, nil
}
