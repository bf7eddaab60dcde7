package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// checkFailClosed asks the running agent what it keeps only because an
// input is unknown or stale (gcagent_fail_closed_kept): WARN naming each
// count when any, OK when none or when no agent answers (plan says what a
// start would keep).
func checkFailClosed(ctx context.Context, cfg Config) CheckResult {
	text, err := agentText(ctx, cfg.MetricsAddress, "/metrics")
	if err != nil {
		return okLine("fail-closed", "no agent answers on --metrics-address %s: `gcagent plan` shows what a start would keep only because an input is not known", cfg.MetricsAddress)
	}
	var kept []string
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, "gcagent_fail_closed_kept{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		n, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if !ok || err != nil || n == 0 {
			continue
		}
		kept = append(kept, fmt.Sprintf("%.0f %s", n, strings.NewReplacer(`input="`, "", `kind="`, "", `"`, "", ",", " ").Replace(labels)))
	}
	if len(kept) == 0 {
		return okLine("fail-closed", "the agent on %s keeps nothing only because an input is not known", cfg.MetricsAddress)
	}
	return warnLine("fail-closed", "the agent on %s keeps, only because an input is not known: %s (its /readyz says why; `gcagent plan` lists them)",
		cfg.MetricsAddress, strings.Join(kept, ", "))
}

// agentText GETs path of the agent at addr (a loopback address for an
// unspecified host).
func agentText(ctx context.Context, addr, path string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", path, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return string(b), err
}
