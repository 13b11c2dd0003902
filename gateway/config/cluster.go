package config

import (
	"crypto/hmac"
	"crypto/sha256"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// Cluster makes this gateway one replica of several that serve any
// session wherever a client lands: an owner registry in a shared Redis,
// and an internal listener on which the others carry requests to it
// (restart only).
type Cluster struct {
	// Name is this replica's name, unique among the replicas: the first
	// part of its connection IDs and resume tokens (default: the host name,
	// cut at its first dot). 1 to 63 of A-Z a-z 0-9 _ -.
	Name string `yaml:"name"`
	// Store is the owner registry: "redis://[user:password@]host:port[/db]"
	// or rediss://. Required.
	Store string `yaml:"store"`
	// Listen is the internal listener (host:port) the other replicas reach
	// this one on; never the public listen address. Required.
	Listen string `yaml:"listen"`
	// Advertise is the URL the other replicas reach Listen at (default:
	// http://<listen>).
	Advertise string `yaml:"advertise"`
	// KeyFile holds the key replicas sign what they carry to each other
	// with (64 hex characters; `acpgate keygen` writes one). Default: a key
	// derived from the session key, which replicas share already.
	KeyFile string `yaml:"key_file"`
	// Lease is an owner record's lease: a replica that dies stops holding
	// its sessions within it (default 5s).
	Lease Duration `yaml:"lease"`
}

var replicaName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,63}$`)

// ReplicaName is the replica's name: Name, or the host name's first label.
func (cl *Cluster) ReplicaName() string {
	if cl.Name != "" {
		return cl.Name
	}
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(h, ".")
	return h
}

// AdvertiseURL is Advertise, or http://<listen>.
func (cl *Cluster) AdvertiseURL() string {
	if cl.Advertise != "" {
		return strings.TrimSuffix(cl.Advertise, "/")
	}
	return "http://" + cl.Listen
}

// ClusterKey is the envelope key: KeyFile's, or derived from the first session
// key.
func (c *Config) ClusterKey() ([]byte, error) {
	if c.Cluster.KeyFile != "" {
		return ReadSessionKey(c.Cluster.KeyFile)
	}
	keys, err := c.SessionKeys()
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	h := hmac.New(sha256.New, keys[0])
	h.Write([]byte("acpgate cluster key"))
	return h.Sum(nil), nil
}

// validate checks the cluster block of c (nil: none).
func (cl *Cluster) validate(c *Config, add addFunc) {
	if cl == nil {
		return
	}
	if name := cl.ReplicaName(); !replicaName.MatchString(name) {
		add("cluster.name", "%q: want 1 to 63 of A-Z a-z 0-9 _ - (set it when the host name does not fit)", name)
	}
	if u, err := url.Parse(cl.Store); cl.Store == "" || err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		add("cluster.store", "want redis://[user:password@]host:port[/db] or rediss://…")
	}
	if _, _, err := net.SplitHostPort(cl.Listen); err != nil {
		add("cluster.listen", "%q is not host:port", cl.Listen)
	} else if cl.Listen == c.Listen || cl.Listen == c.Observability.MetricsListen {
		add("cluster.listen", "must differ from listen and metrics_listen: it is the replicas' own listener")
	}
	if cl.Advertise != "" {
		if u, err := url.Parse(cl.Advertise); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			add("cluster.advertise", "%q: want http://host:port or https://host:port", cl.Advertise)
		}
	}
	if cl.Lease < 0 {
		add("cluster.lease", "must not be negative")
	}
	if cl.KeyFile != "" {
		if _, err := ReadSessionKey(cl.KeyFile); err != nil {
			add("cluster.key_file", "%v", err)
		}
	} else if len(c.SessionKeyFiles) == 0 && c.SessionKeyFile == "" {
		add("cluster", "needs a session key shared by the replicas (session_key_file) or cluster.key_file: "+
			"replicas must open each other's session IDs and sign what they carry to each other")
	}
}
