package config

// Values of lock.backend.
const (
	// LockRedis: the leases live in Redis (redis.*), the default.
	LockRedis = "redis"
	// LockPostgres: the leases live in Postgres (outbox_leases), judged on
	// Postgres' clock.
	LockPostgres = "postgres"
	// lockEtcd is named in the contract but not built: refused by name.
	lockEtcd = "etcd"
)

// Lock is the lock section: where the leases live.
type Lock struct {
	Backend string `mapstructure:"backend"` // redis | postgres
}

func (c *Config) validateLock() error {
	switch c.Lock.Backend {
	case LockRedis, LockPostgres:
		return nil
	case lockEtcd:
		return bad("lock.backend", "etcd is not built yet; use %s or %s", LockRedis, LockPostgres)
	}
	return bad("lock.backend", "must be %s or %s, got %q", LockRedis, LockPostgres, c.Lock.Backend)
}
