package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outboxd/outboxd/config"
)

// healthCmd is the container healthcheck: the image is distroless (no
// shell, no curl), so the binary asks its own /readyz.
func healthCmd(g *globals, stdout io.Writer) *cobra.Command {
	var target string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "health [--url URL] [--timeout 3s]",
		Short: "Exit 0 if /readyz on http.addr (or --url) answers 200, else 1 with one line saying what failed",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if timeout <= 0 {
				return usageError{fmt.Errorf("--timeout must be positive, got %s", timeout)}
			}
			if target == "" {
				cfg, err := g.load(config.HTTPSection)
				if err != nil {
					return err
				}
				if target, err = readyzURL(cfg.HTTP.Addr); err != nil {
					return &config.KeyError{Key: "http.addr", Err: err}
				}
			} else if u, err := url.Parse(target); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usageError{fmt.Errorf("--url wants an http(s) URL, got %q", target)}
			}
			return checkReady(cmd, target, timeout, stdout)
		},
	}
	// /readyz gives each dependency 2s: the default leaves room for its answer.
	cmd.Flags().DurationVar(&timeout, "timeout", 3*time.Second, "give up after this long")
	cmd.Flags().StringVar(&target, "url", "", "readiness URL to ask (default http://<http.addr>/readyz, 127.0.0.1 for a wildcard host)")
	return cmd
}

// readyzURL is the /readyz URL of a server listening on addr: a wildcard
// or empty host is reached on the loopback address.
func readyzURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("want host:port, got %q: %w", addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}

func checkReady(cmd *cobra.Command, target string, timeout time.Duration, stdout io.Writer) error {
	client := &http.Client{
		Transport:     &http.Transport{DisableKeepAlives: true}, // one request, then the process ends
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, target, nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("not ready: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("not ready: %s answered %d, body unreadable: %w", target, resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("not ready: %s answered %d: %s", target, resp.StatusCode, failures(body))
	}
	fmt.Fprintf(stdout, "ready: %s\n", target)
	return nil
}

// failures says which dependencies /readyz reports failing, on one line.
func failures(body []byte) string {
	var checks map[string]string
	if err := json.Unmarshal(body, &checks); err != nil || len(checks) == 0 {
		return oneLine(string(body), 300)
	}
	var out []string
	for _, name := range slices.Sorted(maps.Keys(checks)) {
		if checks[name] != "ok" {
			out = append(out, name+": "+oneLine(checks[name], 300))
		}
	}
	if len(out) == 0 {
		return "no dependency reported failing"
	}
	return strings.Join(out, "; ")
}

// oneLine folds s onto one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	if s == "" {
		return "(empty body)"
	}
	return s
}
