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

	"github.com/acpgate/acpgate/proxy/usage"
)

// Redis is a store shared by the gateway's replicas: one hash per tenant
// and period ("acpgate:budget:" and the key), with a field "tokens" and one
// "cost:" field per currency, expiring some time after its period; a hash
// per agent session for its kept values (redisKeptKey); each update one
// script.
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

// redisKeptKey is the hash of a tenant's agent session's kept values: a
// field per currency, expiring keepPeriods after its last report.
func redisKeptKey(tenant, session string) string {
	return "acpgate:budget-kept:" + tenant + "/" + session
}

// addScript is an Add, one script (atomic in Redis): KEYS[1] the ledger
// hash, KEYS[2:] each mark's kept-value hash; ARGV: tokens, the ledger's
// expiry (unix seconds), the kept values' lifetime (seconds), the largest
// increase one report may count, the number of cost additions, then each
// addition (currency, amount) and each mark (currency, "1" if First else
// "0", From, Total). A mark's rule is counted's.
var addScript = redis.NewScript(`
local k = KEYS[1]
if ARGV[1] ~= "0" then redis.call("HINCRBY", k, "tokens", ARGV[1]) end
local maxinc = tonumber(ARGV[4])
local i = 6
for _ = 1, tonumber(ARGV[5]) do
  redis.call("HINCRBYFLOAT", k, "cost:" .. ARGV[i], ARGV[i + 1])
  i = i + 2
end
for j = 2, #KEYS do
  local cur, first, from, total = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if total >= from then
    local inc = total
    if first == "0" then
      inc = total - from
    else
      local was = redis.call("HGET", KEYS[j], cur)
      if was and from >= tonumber(was) then inc = total - tonumber(was) end
    end
    if inc > 0 and inc <= maxinc then
      redis.call("HINCRBYFLOAT", k, "cost:" .. cur, string.format("%.17g", inc))
    end
    redis.call("HSET", KEYS[j], cur, ARGV[i + 3])
    redis.call("EXPIRE", KEYS[j], ARGV[3])
  end
  i = i + 4
end
redis.call("EXPIREAT", k, ARGV[2])
return redis.call("HGETALL", k)
`)

func (r *Redis) Add(ctx context.Context, key Key, add Spent, marks []Mark, next time.Time) (Spent, error) {
	ctx, cancel := context.WithTimeout(ctx, redisTimeout)
	defer cancel()
	keys := []string{redisKey(key)}
	args := []any{strconv.FormatInt(add.Tokens, 10), next.Add(keepPeriods).Unix(), int64(keepPeriods / time.Second),
		strconv.FormatFloat(usage.MaxCostIncrease, 'g', -1, 64)}
	var costs []any
	for cur, v := range add.Cost {
		if v != 0 {
			costs = append(costs, cur, strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	args = append(append(args, len(costs)/2), costs...)
	for _, mk := range marks {
		keys = append(keys, redisKeptKey(key.Tenant, mk.Session))
		first := "0"
		if mk.First {
			first = "1"
		}
		args = append(args, mk.Currency, first, strconv.FormatFloat(mk.From, 'g', -1, 64), strconv.FormatFloat(mk.Total, 'g', -1, 64))
	}
	flat, err := addScript.Run(ctx, r.client, keys, args...).StringSlice()
	if err != nil {
		return Spent{}, fmt.Errorf("budget ledger %s: %w", r.name, err)
	}
	h := make(map[string]string, len(flat)/2)
	for i := 0; i+1 < len(flat); i += 2 {
		h[flat[i]] = flat[i+1]
	}
	return parseHash(h)
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

// RedisClient connects to the Redis spec names (redis:// or rediss://)
// for another user of the shared store (what names the setting in errors),
// each call bounded by timeout. It returns the client and the URL without
// its password, for logs and errors.
func RedisClient(spec, what string, timeout time.Duration) (*redis.Client, string, error) {
	opts, err := redis.ParseURL(spec)
	if err != nil {
		return nil, "", fmt.Errorf("%s %s: %s", what, redactURL(spec), scrub(err.Error(), spec))
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = timeout, timeout, timeout
	opts.MaxRetries = 0
	return redis.NewClient(opts), redactURL(spec), nil
}
