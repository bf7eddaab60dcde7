package trace

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Source says where a trace is read from: a file of JSON lines (an
// export; "-" reads Stdin), else the agent answering at Agent (its
// metrics address: GET /trace), else the state file in StateDir, read
// only (which fails while an agent holds it).
type Source struct {
	File     string
	Stdin    io.Reader
	Agent    string
	StateDir string
	// Bad, if set, is told of each line of File that is not a record
	// (skipped); nil makes one an error.
	Bad func(line int, err error)
}

// String says where the trace was read from.
func (s Source) String() string {
	switch {
	case s.File == "-":
		return "standard input"
	case s.File != "":
		return s.File
	case s.Agent != "":
		return "the agent at " + s.Agent + ", else " + filepath.Join(s.StateDir, "state.db")
	}
	return filepath.Join(s.StateDir, "state.db")
}

// Fetch reads the trace src names: its header (the node and cluster when
// known; Skipped, what the stored trace held that could not be read and
// was left out) and its records, canonical (Load). from says where they
// came from.
func Fetch(ctx context.Context, src Source) (header Record, recs []Record, from string, err error) {
	switch {
	case src.File == "-":
		header, recs, err = decodeAll(src.Stdin, src.Bad)
		return header, recs, "standard input", err
	case src.File != "":
		f, err := os.Open(src.File)
		if err != nil {
			return header, nil, src.File, err
		}
		defer f.Close()
		header, recs, err = decodeAll(f, src.Bad)
		return header, recs, src.File, err
	}
	if src.Agent != "" {
		header, recs, from, err = fetchAgent(ctx, src.Agent)
		if !errors.Is(err, errNoAgent) {
			return header, recs, from, err
		}
	}
	path := filepath.Join(src.StateDir, "state.db")
	recs, skipped, err := readStateFile(path)
	header = Record{Ev: KindHeader}
	if skipped.Any() {
		header.Skipped = &skipped
	}
	for _, r := range recs {
		if r.Ev == KindStart && r.Node != "" {
			header.Node, header.Cluster = r.Node, r.Cluster // the agent's, as it last started
		}
	}
	return header, recs, path, err
}

// decodeAll reads an export: the header, if any, then the records, made
// canonical.
func decodeAll(r io.Reader, bad func(int, error)) (Record, []Record, error) {
	var header Record
	var recs []Record
	err := Decode(r, func(rec Record) error {
		if rec.Ev == KindHeader {
			if header.Ev == "" {
				header = rec
			}
			return nil
		}
		recs = append(recs, rec)
		return nil
	}, bad)
	return header, Canonical(recs), err
}

// readStateFile reads the trace of an agent's state file, read-only: a
// damaged file is an error, never a panic; a chunk or record of the trace
// that does not decode is skipped (Load).
func readStateFile(path string) (recs []Record, skipped Skipped, err error) {
	if _, err := os.Stat(path); err != nil {
		return nil, skipped, err
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			recs, err = nil, fmt.Errorf("state %s unreadable: %v", path, r)
		}
	}()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: true})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, skipped, fmt.Errorf("state %s is held by a running agent that does not answer on its metrics address", path)
		}
		return nil, skipped, fmt.Errorf("open state %s read-only: %w", path, err)
	}
	defer db.Close()
	return Load(db)
}

var errNoAgent = errors.New("no agent answers")

// fetchAgent reads the trace of the agent at addr (GET /trace);
// errNoAgent when nothing listens there.
func fetchAgent(ctx context.Context, addr string) (Record, []Record, string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return Record{}, nil, addr, err
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	url := "http://" + net.JoinHostPort(host, port) + "/trace"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Record{}, nil, url, err
	}
	resp, err := http.DefaultClient.Do(req)
	if errors.Is(err, syscall.ECONNREFUSED) {
		return Record{}, nil, url, errNoAgent
	}
	if err != nil {
		return Record{}, nil, url, fmt.Errorf("agent at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return Record{}, nil, url, fmt.Errorf("agent at %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	header, recs, err := decodeAll(resp.Body, nil)
	if err != nil {
		err = fmt.Errorf("agent at %s: %w", url, err)
	}
	return header, recs, url, err
}

// ExportOptions are `gcagent trace export`'s.
type ExportOptions struct {
	Source Source
	// Node and Cluster name the node in the header when the source does
	// not (a state file).
	Node, Cluster string
}

// ExportCommand writes the trace o.Source names to w as JSON lines, its
// header first (`gcagent trace export`).
func ExportCommand(ctx context.Context, o ExportOptions, w io.Writer) error {
	header, recs, _, err := Fetch(ctx, o.Source)
	if err != nil {
		return err
	}
	if header.Node == "" {
		header.Node, header.Cluster = o.Node, o.Cluster
	}
	header.T = time.Time{}
	return Export(w, header, recs)
}
