package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/admin"
)

// tokenEnv is the environment variable --via reads the bearer token from
// when --token-file is not given.
const tokenEnv = "OUTBOXD_TOKEN"

// viaFlags send a command to a relay's admin API (--via URL) instead of
// acting on Postgres and Redis with the configuration's credentials.
type viaFlags struct {
	url, tokenFile string
	timeout        time.Duration
}

func (v *viaFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&v.url, "via", "", "send it to a relay's admin API at this ops URL (http://host:port) instead of using the database; token from --token-file or $"+tokenEnv)
	cmd.Flags().StringVar(&v.tokenFile, "token-file", "", "with --via: a file holding the bearer token (default: $"+tokenEnv+")")
	cmd.Flags().DurationVar(&v.timeout, "via-timeout", 5*time.Minute, "with --via: how long to wait for the answer")
}

// on: the command goes to the admin API.
func (v *viaFlags) on() bool { return v.url != "" }

// token reads the bearer token: --token-file, else $OUTBOXD_TOKEN.
func (v *viaFlags) token() (string, error) {
	if v.tokenFile == "" {
		t := strings.TrimSpace(os.Getenv(tokenEnv))
		if t == "" {
			return "", usageError{errors.New("--via: a write needs a bearer token: --token-file FILE or $" + tokenEnv)}
		}
		return t, nil
	}
	b, err := os.ReadFile(v.tokenFile)
	if err != nil {
		return "", usageError{fmt.Errorf("--token-file: %w", err)}
	}
	return strings.TrimSpace(string(b)), nil
}

// paramsOf are the flags of names set on fs, as an admin write's
// parameters.
func paramsOf(fs *pflag.FlagSet, names []string) admin.Params {
	p := admin.Params{}
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil || !f.Changed {
			continue
		}
		v := f.Value.String()
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			v = strings.Join(sv.GetSlice(), ",")
		}
		p[n] = v
	}
	return p
}

// post sends p to the admin API's path and decodes a 200's body into out.
// A refusal is an error with the API's message; a 400 is a usage error.
// A write always needs the token.
func (v *viaFlags) post(ctx context.Context, path string, p admin.Params, out any) error {
	tok, err := v.token()
	if err != nil {
		return err
	}
	body, err := json.Marshal(p)
	if err != nil {
		return err
	}
	b, err := v.do(ctx, http.MethodPost, path, tok, body)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// get reads the admin API's path (with query q) and returns a 200's body.
// The token goes along when there is one (--token-file, $OUTBOXD_TOKEN);
// without one the relay answers reads only where it allows them without a
// token (as /status and /dead).
func (v *viaFlags) get(ctx context.Context, path string, q url.Values) ([]byte, error) {
	tok := ""
	if v.tokenFile != "" || strings.TrimSpace(os.Getenv(tokenEnv)) != "" {
		var err error
		if tok, err = v.token(); err != nil {
			return nil, err
		}
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return v.do(ctx, http.MethodGet, path, tok, nil)
}

// do sends one request to the admin API and returns a 200's body; tok ""
// sends no Authorization header.
func (v *viaFlags) do(ctx context.Context, method, path, tok string, body []byte) ([]byte, error) {
	u, err := url.Parse(v.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, usageError{fmt.Errorf("--via: want http://host:port, got %q", v.url)}
	}
	ctx, cancel := context.WithTimeout(ctx, v.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(v.url, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("--via: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("--via: reading the answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		err := fmt.Errorf("%s%s answered %s: %s", v.url, path, resp.Status, e.Error)
		if resp.StatusCode == http.StatusBadRequest {
			return nil, usageError{err}
		}
		return nil, err
	}
	return b, nil
}

// printJSON prints a JSON answer as it came, indented when indent.
func printJSON(w io.Writer, b []byte, indent bool) error {
	var buf bytes.Buffer
	var err error
	if indent {
		err = json.Indent(&buf, b, "", "  ")
	} else {
		err = json.Compact(&buf, b)
	}
	if err != nil {
		return fmt.Errorf("--via: the answer is not JSON: %w", err)
	}
	buf.WriteByte('\n')
	_, err = w.Write(buf.Bytes())
	return err
}
