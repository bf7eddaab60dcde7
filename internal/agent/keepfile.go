package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gcagent/gcagent/natsbus"
)

// The fleet keep list's copy in the state dir (KeepListFile): what the
// agent keeps by while NATS is away, also across restarts, and the
// evidence of its own embedded store.

// ReadKeepFile reads the fleet keep list an agent saved in stateDir.
func ReadKeepFile(stateDir string) (keepDoc, error) {
	doc := keepDoc{Lists: map[string]natsbus.KeepList{}}
	b, err := os.ReadFile(filepath.Join(stateDir, KeepListFile))
	if err != nil {
		return doc, err
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return doc, fmt.Errorf("%s: %w", KeepListFile, err)
	}
	if doc.Lists == nil {
		doc.Lists = map[string]natsbus.KeepList{}
	}
	return doc, nil
}

// save writes the file; the caller holds mu.
func (k *fleetKeep) save(now time.Time) error {
	k.doc.Source = k.source
	k.doc.Cluster = k.cl.last
	b, err := json.MarshalIndent(k.doc, "", "  ")
	if err != nil {
		return err
	}
	// Synced before and after the rename: after a power loss the file is
	// the old list or the new one, never empty (an agent cut off from NATS
	// at boot protects by it).
	tmp := k.file + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, k.file); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(k.file)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	k.saved = now
	return nil
}
