package trace

import (
	"cmp"
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
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("no state file %s (no agent ran with --state-dir %s)%s", path, src.StateDir, noAgentAt(src.Agent))
	}
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

// DamagedError is a state file whose trace could be read only in part:
// Read records came before the damage (Err); the rest may be missing.
type DamagedError struct {
	Path string
	Read int
	Err  error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("state %s is damaged (%v): %d records read, the rest may be missing", e.Path, e.Err, e.Read)
}

func (e *DamagedError) Unwrap() error { return e.Err }

// readStateFile reads the trace of an agent's state file, read-only: a
// damaged file is an error, never a panic. The file is checked as plan
// checks it (truncated, pages not reachable); what could be read of a
// damaged one comes with a *DamagedError. A chunk or record of the trace
// that does not decode is skipped and said in skipped (Read).
func readStateFile(path string) (recs []Record, skipped Skipped, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, skipped, err
	}
	if fi.Size() == 0 {
		return nil, skipped, fmt.Errorf("state %s is empty (0 bytes): not a state file", path)
	}
	damaged := func(cause error) ([]Record, Skipped, error) {
		if len(recs) == 0 {
			return nil, skipped, fmt.Errorf("state %s unreadable: %w", path, cause)
		}
		return Canonical(recs), skipped, &DamagedError{Path: path, Read: len(recs), Err: cause}
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			recs, skipped, err = damaged(fmt.Errorf("%v", r))
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
	var check error
	_ = db.View(func(tx *bolt.Tx) error {
		if fi.Size() < tx.Size() {
			check = fmt.Errorf("state file is %d bytes, its meta page says %d: truncated", fi.Size(), tx.Size())
			return nil
		}
		for e := range tx.Check() {
			check = cmp.Or(check, e)
		}
		if (tx.Bucket(bucketChunks) == nil) != (tx.Bucket(bucketBase) == nil) {
			// Open makes both: one alone is a trace that lost the other.
			check = cmp.Or(check, errors.New("the trace's chunks or its base is missing"))
		}
		return nil
	})
	if check != nil && strings.HasSuffix(check.Error(), "truncated") {
		return damaged(check) // reading would fault past the end
	}
	skipped, err = Read(db, func(r Record) error { recs = append(recs, r); return nil })
	if err != nil {
		return damaged(err)
	}
	if check != nil {
		return damaged(check)
	}
	return Canonical(recs), skipped, nil
}

var errNoAgent = errors.New("no agent answers")

// noAgentAt says that no agent answered at addr, when one was asked.
func noAgentAt(addr string) string {
	if addr == "" {
		return ""
	}
	return ", and no agent answers at " + addr + " (--metrics-address)"
}

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
	var damaged *DamagedError
	if err != nil && !errors.As(err, &damaged) {
		return err
	}
	if header.Node == "" {
		header.Node, header.Cluster = o.Node, o.Cluster
	}
	header.T = time.Time{}
	if err := Export(w, header, recs); err != nil {
		return err
	}
	if damaged != nil {
		// What could be read is written; the export is not whole.
		return fmt.Errorf("partial export: %w", damaged)
	}
	return nil
}
