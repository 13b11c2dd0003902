// Package metricscrape fetches and reads the Prometheus text exposition a
// gateway serves at /metrics, for tests that check its counters.
package metricscrape

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

var client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// Get returns the status and body of GET http://addr/metrics (addr on
// loopback).
func Get(addr string) (int, string, error) {
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// Parse returns every sample of text: those without labels by name,
// labelled ones by their whole "name{labels}".
func Parse(text string) map[string]float64 {
	out := map[string]float64{}
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// Sample returns the value of the sample line "name{labels} value" (labels
// exactly as written by client_golang, e.g. `result="failure"`; "" for a
// metric without labels), or -1 when there is none.
func Sample(text, name, labels string) float64 {
	prefix := name + " "
	if labels != "" {
		prefix = name + "{" + labels + "} "
	}
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// Sum adds up the samples of name whose label set contains every one of
// labels (each `key="value"`); 0 when none does.
func Sum(text, name string, labels ...string) float64 {
	var sum float64
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); ok && err == nil {
			sum += v
		}
	}
	return sum
}
