package config

import "time"

// Values of lock.backend.
const (
	// LockRedis: the leases live in Redis (redis.*), the default.
	LockRedis = "redis"
	// LockPostgres: the leases live in Postgres (outbox_leases), judged on
	// Postgres' clock.
	LockPostgres = "postgres"
	// LockEtcd: the leases live in etcd (lock.etcd.*), an etcd lease each.
	LockEtcd = "etcd"
)

// minEtcdLockTTL is the shortest lease etcd grants with its default
// election timeout (1 s): 1.5 election timeouts, in whole seconds.
const minEtcdLockTTL = 2 * time.Second

// Lock is the lock section: where the leases live.
type Lock struct {
	Backend string   `mapstructure:"backend"` // redis | postgres | etcd
	Etcd    EtcdLock `mapstructure:"etcd"`
}

// EtcdLock is lock.etcd: the etcd cluster of lock.backend etcd.
type EtcdLock struct {
	// Endpoints are the members' client URLs or host:port.
	Endpoints   []string      `mapstructure:"endpoints"`
	DialTimeout time.Duration `mapstructure:"dial_timeout"`
	// KeyPrefix is put before the lock names and fence keys.
	KeyPrefix    string `mapstructure:"key_prefix"`
	Username     string `mapstructure:"username"`
	Password     string `mapstructure:"password"`
	PasswordFile string `mapstructure:"password_file"`
	TLS          TLS    `mapstructure:"tls"`
}

func (c *Config) validateLock() error {
	switch c.Lock.Backend {
	case LockRedis, LockPostgres:
		return nil
	case LockEtcd:
		return c.validateEtcd()
	}
	return bad("lock.backend", "must be %s, %s or %s, got %q", LockRedis, LockPostgres, LockEtcd, c.Lock.Backend)
}

// validateEtcd checks lock.etcd and that the lock TTLs are leases etcd
// grants as asked: whole seconds, no shorter than its minimum.
func (c *Config) validateEtcd() error {
	e := c.Lock.Etcd
	if len(e.Endpoints) == 0 {
		return bad("lock.etcd.endpoints", "must list the etcd members with lock.backend etcd")
	}
	for _, ep := range e.Endpoints {
		if ep == "" {
			return bad("lock.etcd.endpoints", "holds an empty endpoint")
		}
	}
	if e.DialTimeout <= 0 {
		return bad("lock.etcd.dial_timeout", "must be a positive duration, got %s", e.DialTimeout)
	}
	if e.Password != "" && e.Username == "" {
		return bad("lock.etcd.username", "must be set with lock.etcd.password")
	}
	if err := CheckTLSFiles("lock.etcd.tls", e.TLS); err != nil {
		return err
	}
	for _, k := range []keyDuration{{"poller.lock_ttl", c.Poller.LockTTL}, {"reconcile.lock_ttl", c.Reconcile.LockTTL}} {
		if k.d%time.Second != 0 || k.d < minEtcdLockTTL {
			return bad(k.key, "with lock.backend etcd, want whole seconds of at least %s (etcd leases), got %s", minEtcdLockTTL, k.d)
		}
	}
	return nil
}
