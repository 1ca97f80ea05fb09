package etcdlease_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/outboxd/outboxd/lock"
	"github.com/outboxd/outboxd/lock/etcdlease"
	"github.com/outboxd/outboxd/lock/leasetest"
)

var prefixes atomic.Int64

// subject is the etcd lease on srv under a prefix of its own: each replica
// on a client of its own, as replicas are. Remove deletes the lock key
// (the fence key stays, as after an expiry); Steal puts the key anew, on
// no lease, as another writer would. Waiting is left out: a watch cannot
// be seen from another client, so the suite gives the waiter a moment.
func subject(t *testing.T, srv *server) leasetest.Subject {
	prefix := fmt.Sprintf("conformance/%d/", prefixes.Add(1))
	admin := srv.newClient(t)
	key := func(name string) string { return prefix + name }
	return leasetest.Subject{
		Replica: func() lock.Lease { return etcdlease.New(srv.newClient(t), etcdlease.WithKeyPrefix(prefix)) },
		Remove: func(ctx context.Context, name string) error {
			_, err := admin.Delete(ctx, key(name))
			return err
		},
		Steal: func(ctx context.Context, name string) error {
			_, err := admin.Put(ctx, key(name), "thief")
			return err
		},
	}
}

// The etcd lease passes the lease conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	leasetest.Run(t, func(t *testing.T) leasetest.Subject { return subject(t, srv) })
}
