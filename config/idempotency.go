package config

// Values of idempotency.store.
const (
	// IdempotencyRedis: the idempotency keys live in Redis (redis.*).
	IdempotencyRedis = "redis"
	// IdempotencyPostgres: they live in Postgres (table
	// outbox_idempotency), beside the outbox.
	IdempotencyPostgres = "postgres"
)

// Idempotency is the idempotency section: where the claims and delivered
// marks of idempotency:notify:<outbox_id> live. Store "" (the default)
// follows lock.backend: postgres with the Postgres lease, which then needs
// no Redis at all; redis otherwise.
type Idempotency struct {
	Store string `mapstructure:"store"` // redis | postgres
}

// resolveIdempotency fills an unset idempotency.store from lock.backend.
func (c *Config) resolveIdempotency() {
	if c.Idempotency.Store != "" {
		return
	}
	c.Idempotency.Store = IdempotencyRedis
	if c.Lock.Backend == LockPostgres {
		c.Idempotency.Store = IdempotencyPostgres
	}
}

func (c *Config) validateIdempotency() error {
	switch c.Idempotency.Store {
	case IdempotencyRedis, IdempotencyPostgres:
		return nil
	}
	return bad("idempotency.store", "must be %s or %s (or unset: follows lock.backend), got %q", IdempotencyRedis, IdempotencyPostgres, c.Idempotency.Store)
}

// UsesRedis reports whether the lease or the idempotency keys live in
// Redis. When neither does, outboxd opens no Redis connection and
// redis.* is not checked (a redis_stream sink still reads its own
// dispatch.redis_stream.addr).
func (c *Config) UsesRedis() bool {
	return c.Lock.Backend == LockRedis || c.Idempotency.Store == IdempotencyRedis
}
