package budget

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a store shared by the gateway's replicas: one hash per tenant
// and period ("acpgate:budget:" and the key), with a field "tokens" and one
// "cost:" field per currency, each update one MULTI/EXEC, expiring some
// time after its period.
type Redis struct {
	name   string
	client *redis.Client
}

// redisTimeout bounds one call to Redis (the prompt waits for a check).
const redisTimeout = 2 * time.Second

// OpenRedis connects to the Redis spec names (redis:// or rediss://). It
// does not wait for Redis: a Redis that is down fails the calls, not this.
func OpenRedis(spec string) (*Redis, error) {
	opts, err := redisOptions(spec)
	if err != nil {
		return nil, err
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = redisTimeout, redisTimeout, redisTimeout
	opts.MaxRetries = 1
	return &Redis{name: redactURL(spec), client: redis.NewClient(opts)}, nil
}

// redisOptions parses a redis:// or rediss:// URL; its error never shows
// the password.
func redisOptions(spec string) (*redis.Options, error) {
	opts, err := redis.ParseURL(spec)
	if err != nil { // its text may quote the URL, password and all
		return nil, fmt.Errorf("budgets.store %s: %s", redactURL(spec), scrub(err.Error(), spec))
	}
	return opts, nil
}

// scrub is msg without spec's user information, however msg quotes it.
func scrub(msg, spec string) string {
	_, rest, _ := strings.Cut(spec, "://")
	at := strings.LastIndex(rest, "@")
	if at <= 0 {
		return msg
	}
	user := rest[:at]
	for _, s := range []string{user, strconv.Quote(user)[1 : len(strconv.Quote(user))-1], url.PathEscape(user)} {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	if _, pass, ok := strings.Cut(user, ":"); ok && pass != "" {
		msg = strings.ReplaceAll(msg, pass, "xxxxx")
	}
	return msg
}

func (r *Redis) Name() string { return r.name }

func redisKey(key Key) string { return "acpgate:budget:" + key.String() }

func (r *Redis) Get(ctx context.Context, key Key) (Spent, error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	h, err := r.client.HGetAll(ctx, redisKey(key)).Result()
	if err != nil {
		return Spent{}, fmt.Errorf("budget ledger %s: %w", r.name, err)
	}
	return parseHash(h)
}

func (r *Redis) Add(ctx context.Context, key Key, add Spent, next time.Time) (Spent, error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	k := redisKey(key)
	var all *redis.MapStringStringCmd
	_, err := r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		if add.Tokens != 0 {
			p.HIncrBy(ctx, k, "tokens", add.Tokens)
		}
		for cur, v := range add.Cost {
			if v != 0 {
				p.HIncrByFloat(ctx, k, "cost:"+cur, v)
			}
		}
		p.ExpireAt(ctx, k, next.Add(keepPeriods))
		all = p.HGetAll(ctx, k)
		return nil
	})
	if err != nil {
		return Spent{}, fmt.Errorf("budget ledger %s: %w", r.name, err)
	}
	return parseHash(all.Val())
}

func (r *Redis) Reset(ctx context.Context, key Key) error {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	if err := r.client.Del(ctx, redisKey(key)).Err(); err != nil {
		return fmt.Errorf("budget ledger %s: %w", r.name, err)
	}
	return nil
}

func (r *Redis) Close() error { return r.client.Close() }

// parseHash reads a ledger hash.
func parseHash(h map[string]string) (Spent, error) {
	var s Spent
	var errs []error
	for field, v := range h {
		switch {
		case field == "tokens":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("field tokens: %w", err))
			}
			s.Tokens = n
		case strings.HasPrefix(field, "cost:"):
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("field %s: %w", field, err))
			}
			if s.Cost == nil {
				s.Cost = map[string]float64{}
			}
			s.Cost[strings.TrimPrefix(field, "cost:")] = f
		}
	}
	return s, errors.Join(errs...)
}
