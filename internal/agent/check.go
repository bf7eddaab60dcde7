package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/gcagent/gcagent/events"
	"github.com/gcagent/gcagent/gc"
	"github.com/gcagent/gcagent/internal/clock"
	"github.com/gcagent/gcagent/internal/kubeletconfig"
	"github.com/gcagent/gcagent/logs"
	"github.com/gcagent/gcagent/node"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Check statuses: OK, WARN (works, but an operator should look), FAIL
// (the agent cannot do its work as configured).
const (
	CheckOK   = "OK"
	CheckWarn = "WARN"
	CheckFail = "FAIL"
)

// CheckResult is one line of `gcagent check`.
type CheckResult struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

func okLine(name, format string, a ...any) CheckResult {
	return CheckResult{name, CheckOK, fmt.Sprintf(format, a...)}
}
func warnLine(name, format string, a ...any) CheckResult {
	return CheckResult{name, CheckWarn, fmt.Sprintf(format, a...)}
}
func failLine(name, format string, a ...any) CheckResult {
	return CheckResult{name, CheckFail, fmt.Sprintf(format, a...)}
}

// checkTimeout bounds each call a check makes.
const checkTimeout = 5 * time.Second

// nodeFacts is what the checks ask containerd and CRI, gathered once.
type nodeFacts struct {
	version    client.Version
	versionErr error
	status     *runtimeapi.StatusResponse
	statusErr  error
	namespaces []string
	nsErr      error
	// pods are the ready CRI sandboxes (namespace_name_uid, as pod log
	// dirs are named), podUIDs the uids of every sandbox CRI has, ready or
	// not; podsErr when CRI could not list them.
	pods    []string
	podUIDs map[string]bool
	podsErr error
	disk    gc.DiskStats
	diskErr error
	// imageFS is the filesystem measured; imageFSNote its caveat.
	imageFS, imageFSNote string
}

// gatherNode asks containerd (version, namespaces) and CRI (status, ready
// pods, image filesystem) at cfg's address; every error is kept for the
// check it concerns.
func gatherNode(ctx context.Context, cfg Config) nodeFacts {
	var f nodeFacts
	call := func(fn func(context.Context) error) error {
		cctx, cancel := context.WithTimeout(ctx, checkTimeout)
		defer cancel()
		return fn(cctx)
	}
	cl, err := client.New(cfg.ContainerdAddress, node.ClientOpts()...)
	if err != nil {
		f.versionErr, f.statusErr, f.nsErr, f.podsErr, f.diskErr = err, err, err, err, err
		return f
	}
	defer cl.Close()
	f.versionErr = call(func(ctx context.Context) (err error) { f.version, err = cl.Version(ctx); return })
	f.nsErr = call(func(ctx context.Context) (err error) { f.namespaces, err = cl.NamespaceService().List(ctx); return })
	conn, err := node.DialCRI(cfg.ContainerdAddress)
	if err != nil {
		f.statusErr, f.podsErr, f.diskErr = err, err, err
		return f
	}
	defer conn.Close()
	cri := runtimeapi.NewRuntimeServiceClient(conn)
	f.statusErr = call(func(ctx context.Context) (err error) {
		f.status, err = cri.Status(ctx, &runtimeapi.StatusRequest{})
		return
	})
	f.podsErr = call(func(ctx context.Context) error {
		resp, err := cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
		f.podUIDs = map[string]bool{}
		for _, p := range resp.GetItems() {
			m := p.GetMetadata()
			f.podUIDs[m.GetUid()] = true
			if p.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
				f.pods = append(f.pods, m.GetNamespace()+"_"+m.GetName()+"_"+m.GetUid())
			}
		}
		return err
	})
	imgFS := node.NewImageFS(cfg.ImageFS, DefaultContainerdRoot, runtimeapi.NewImageServiceClient(conn))
	f.disk, f.diskErr = imgFS.Disk()
	f.imageFS, f.imageFSNote = imgFS.Chosen(), imgFS.Note()
	return f
}

// Checks runs every preflight check of `gcagent check` against the node
// cfg describes, in a fixed order, one result each. It deletes and
// changes nothing (the state dir's write test removes its file).
func Checks(ctx context.Context, cfg Config) []CheckResult {
	f := gatherNode(ctx, cfg)
	nss, _ := cfg.Namespaces() // Validate checked it
	out := []CheckResult{
		checkContainerd(cfg.ContainerdAddress, f.version, f.versionErr),
		checkCRI(f.status, f.statusErr),
		checkNamespaces(nss, f.namespaces, f.nsErr),
		checkImageFS(f, cfg.ImageGCHighThreshold, cfg.ImageGCLowThreshold, cfg.ImageMaximumGCAge),
		checkLogDir("log-dir", cfg.LogDir, "the kubelet's container log links"),
		checkPodLogDir(cfg, f),
		checkStateDir(cfg.StateDir, cfg.OutboxMaxBytes),
		checkPlainContainers(ctx, cfg, f),
	}
	out = append(out, checkKubelet(cfg, f.disk.CapacityBytes)...)
	out = append(out, checkNATS(ctx, cfg), checkClock(time.Now(), filepath.Join(cfg.StateDir, clock.File)), checkFailClosed(ctx, cfg))
	return out
}

// LogChecks runs Checks once and logs each result as a line (OK as
// info, WARN as warn, FAIL as error), except those named in skip (said
// otherwise already): the agent's preflight at start. It never fails the
// start.
func LogChecks(ctx context.Context, cfg Config, log zerolog.Logger, skip ...string) {
	log = log.With().Str("component", "check").Logger()
	start := time.Now()
	results := Checks(ctx, cfg)
	for _, r := range results {
		if slices.Contains(skip, r.Name) {
			continue
		}
		e := log.Info()
		switch r.Status {
		case CheckWarn:
			e = log.Warn()
		case CheckFail:
			e = log.Error()
		}
		e.Str("check", r.Name).Str("status", r.Status).Str("detail", r.Detail).Msg("preflight: " + r.Name)
	}
	log.Debug().Float64("duration_s", time.Since(start).Seconds()).Int("checks", len(results)).Msg("preflight checked")
}

func checkContainerd(addr string, v client.Version, err error) CheckResult {
	if err != nil {
		return failLine("containerd", "%s: %s", addr, errText(err))
	}
	return okLine("containerd", "%s: containerd %s (revision %s)", addr, v.Version, v.Revision)
}

// checkCRI: CRI answers and its runtime is ready. A node without CRI
// (plain containerd) is a WARN: gcagent still collects its namespaces.
func checkCRI(st *runtimeapi.StatusResponse, err error) CheckResult {
	if err != nil {
		return warnLine("cri", "CRI does not answer (%s): only plain containerd objects are collected; CRI pods' sandbox image and log links are not learned", errText(err))
	}
	var conds []string
	ready := false
	for _, c := range st.GetStatus().GetConditions() {
		conds = append(conds, fmt.Sprintf("%s=%v", c.GetType(), c.GetStatus()))
		if c.GetType() == runtimeapi.RuntimeReady {
			ready = c.GetStatus()
		}
	}
	if !ready {
		return warnLine("cri", "runtime not ready (%s)", strings.Join(conds, ", "))
	}
	return okLine("cri", "runtime ready (%s)", strings.Join(conds, ", "))
}

func checkNamespaces(nss events.Namespaces, found []string, err error) CheckResult {
	if err != nil {
		return failLine("namespaces", "cannot list containerd's namespaces: %s", errText(err))
	}
	var managed []string
	for _, ns := range found {
		if nss.Match(ns) {
			managed = append(managed, ns)
		}
	}
	slices.Sort(found)
	if len(managed) == 0 {
		return warnLine("namespaces", "found %s; none managed by --namespace %s (excluded %s): nothing to collect yet",
			orNone(found), nss.String(), orNone(nss.Exclude))
	}
	return okLine("namespaces", "found %s; managed %s", orNone(found), strings.Join(managed, ","))
}

// errText is err without gRPC's "rpc error: code = ... desc =" prefix.
func errText(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// checkImageFS: the image filesystem is measured, and where its usage
// stands against the thresholds.
func checkImageFS(f nodeFacts, high, low int, maxAge time.Duration) CheckResult {
	if f.diskErr != nil {
		return failLine("image-fs", "%s not measured: %v", f.imageFS, f.diskErr)
	}
	d := f.disk
	if d.CapacityBytes == 0 {
		return failLine("image-fs", "%s: capacity 0: threshold GC cannot run", f.imageFS)
	}
	usage := 100 - int(min(d.AvailableBytes, d.CapacityBytes)*100/d.CapacityBytes)
	detail := fmt.Sprintf("%s: %d%% used (%s of %s free); GC starts at %d%%, frees to %d%%", f.imageFS, usage,
		gc.HumanBytes(int64(d.AvailableBytes)), gc.HumanBytes(int64(d.CapacityBytes)), high, low)
	switch {
	case f.imageFSNote != "":
		return warnLine("image-fs", "%s; %s", detail, f.imageFSNote)
	case high == 100 && maxAge == 0:
		return warnLine("image-fs", "%s; image GC off (high threshold 100, no maximum age)", detail)
	case usage >= high && high < 100:
		return warnLine("image-fs", "%s; over the high threshold: GC starts as soon as the agent runs", detail)
	}
	return okLine("image-fs", "%s", detail)
}

// checkLogDir: a log dir exists and is a dir.
func checkLogDir(name, dir, what string) CheckResult {
	res, _ := readLogDir(name, dir, what)
	return res
}

// readLogDir is checkLogDir, and the entries read (nil with a result that
// is not OK).
func readLogDir(name, dir, what string) (CheckResult, []os.DirEntry) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return warnLine(name, "%s does not exist: %s are not cleaned (not mounted? no kubelet on this node?)", dir, what), nil
	case err != nil:
		return failLine(name, "%s: %v", dir, err), nil
	case !fi.IsDir():
		return failLine(name, "%s is not a directory", dir), nil
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return failLine(name, "%s: %v", dir, err), nil
	}
	return okLine(name, "%s: %d entries", dir, len(entries)), entries
}

// checkPodLogDir: the pod log dir exists and is a dir, and holds a dir for
// each ready CRI pod (else the kubelet writes elsewhere: another
// podLogsDir, the host's dir is not what is mounted here, or it is another
// containerd's kubelet). The dirs of pods CRI does not know are counted:
// where CRI's own pods have their dirs they are orphans the agent removes
// once quiet; where none has, the agent removes none of them.
func checkPodLogDir(cfg Config, f nodeFacts) CheckResult {
	const name = "pod-log-dir"
	dir := cfg.PodLogDir
	res, entries := readLogDir(name, dir, "the pods' log dirs")
	if res.Status != CheckOK || f.podsErr != nil {
		return res
	}
	detail := res.Detail
	var missing, unknown []string
	for _, p := range f.pods {
		if _, err := os.Lstat(filepath.Join(dir, p)); err != nil {
			missing = append(missing, p)
		}
	}
	for _, e := range entries {
		if uid, ok := logs.PodUID(e.Name()); ok && e.IsDir() && !f.podUIDs[uid] {
			unknown = append(unknown, e.Name())
		}
	}
	here := len(f.pods) - len(missing)
	if len(f.pods) > 0 {
		detail += fmt.Sprintf("; %d of %d running pods have their log dir here", here, len(f.pods))
	}
	var others string
	if len(unknown) > 0 {
		others = fmt.Sprintf("%d pod dirs here are of pods CRI at %s does not know (e.g. %s)", len(unknown), cfg.ContainerdAddress, unknown[0])
	}
	switch {
	case len(f.pods) > 0 && here == 0:
		line := warnLine(name, "%s, but no log dir of the %d running CRI pods (e.g. %s): is this where the kubelet writes (its podLogsDir), mounted from the host?",
			res.Detail, len(f.pods), missing[0])
		if others != "" {
			line.Detail += "; " + others + ": the agent removes none of them"
		}
		return line
	case others != "" && here > 0:
		return warnLine(name, "%s; %s: orphans, the agent removes each once nothing in it changed for --pod-log-grace %s", detail, others, cfg.PodLogGrace)
	case others != "":
		return warnLine(name, "%s; %s, and no pod of it has its log dir here: the agent removes none of them unless it saw this dir hold that containerd's pods before "+
			"(is --containerd-address the containerd of this node's kubelet?)", detail, others)
	}
	return okLine(name, "%s", detail)
}

// checkStateDir: the state dir takes a file (a real write: as root,
// permissions do not tell, a read-only mount does) and has room for the
// outbox. A dir that does not exist yet is judged by its nearest parent,
// where run creates it.
func checkStateDir(dir string, outboxMax int64) CheckResult {
	at, exists := dir, true
	for {
		if _, err := os.Stat(at); err == nil {
			break
		} else if !errors.Is(err, fs.ErrNotExist) {
			return failLine("state-dir", "%s: %v", at, err)
		}
		exists = false
		parent := filepath.Dir(at)
		if parent == at {
			break
		}
		at = parent
	}
	var werr error
	if exists {
		probe := filepath.Join(dir, fmt.Sprintf(".gcagent-check-%d", os.Getpid()))
		if werr = os.WriteFile(probe, []byte("check\n"), 0o600); werr == nil {
			werr = os.Remove(probe)
		}
	} else {
		werr = unix.Access(at, unix.W_OK)
	}
	if werr != nil {
		if errors.Is(werr, syscall.EROFS) {
			return failLine("state-dir", "%s is on a read-only filesystem: the journal and outbox cannot be written", at)
		}
		return failLine("state-dir", "%s not writable: %v", at, werr)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return failLine("state-dir", "%s: %v", at, err)
	}
	free := int64(st.Bavail) * st.Bsize
	where := dir + ": writable"
	if !exists {
		where = fmt.Sprintf("%s: does not exist yet; run creates it in %s (writable)", dir, at)
	}
	if free < outboxMax {
		return warnLine("state-dir", "%s, %s free: less than the outbox bound %s", where, gc.HumanBytes(free), gc.HumanBytes(outboxMax))
	}
	return okLine("state-dir", "%s, %s free", where, gc.HumanBytes(free))
}

// checkKubelet reads the kubelet's config (--kubelet-config, else the
// default path when it exists) and says whether its image GC is off and
// whether its eviction thresholds fire before gcagent's high threshold. A
// --kubelet-config that is absent WARNs (run follows it until it comes).
func checkKubelet(cfg Config, capacity uint64) []CheckResult {
	k, path := cfg.Kubelet, cfg.KubeletConfig
	if k == nil {
		if path == "" {
			if _, err := os.Stat(kubeletconfig.DefaultPath); err != nil {
				return []CheckResult{okLine("kubelet-config", "none read: --kubelet-config not given and %s absent", kubeletconfig.DefaultPath)}
			}
			path = kubeletconfig.DefaultPath
		}
		var err error
		k, err = kubeletconfig.Read(path)
		if errors.Is(err, fs.ErrNotExist) && cfg.KubeletConfig != "" {
			return []CheckResult{warnLine("kubelet-config", "%s (--kubelet-config) absent: nothing taken from the kubelet, its image GC state unknown; give where this node's kubelet keeps its config (kubeadm %s), or hand image GC over and leave it out", path, kubeletconfig.DefaultPath)}
		}
		if err != nil {
			return []CheckResult{failLine("kubelet-config", "%v", err)}
		}
	}
	var out []CheckResult
	if k.ImageGCOn() {
		out = append(out, warnLine("kubelet-config", "%s", k.ImageGCNote()))
	} else {
		out = append(out, okLine("kubelet-config", "%s: the kubelet's image GC is off (imageGCHighThresholdPercent 100, imageMaximumGCAge 0s)", k.Path))
	}
	var all []string
	for _, t := range k.Eviction {
		all = append(all, t.String())
	}
	switch first := k.EvictionFirst(cfg.ImageGCHighThreshold, capacity); {
	case len(first) > 0:
		var names []string
		for _, t := range first {
			names = append(names, t.String())
		}
		verb := "fire"
		if len(names) == 1 {
			verb = "fires"
		}
		out = append(out, warnLine("kubelet-eviction", "%s %s no later than gcagent's --image-gc-high-threshold %d%%: the kubelet evicts pods before gcagent frees images",
			strings.Join(names, ", "), verb, cfg.ImageGCHighThreshold))
	case len(all) == 0:
		out = append(out, okLine("kubelet-eviction", "no disk eviction thresholds"))
	default:
		out = append(out, okLine("kubelet-eviction", "%s: after gcagent's --image-gc-high-threshold %d%%", strings.Join(all, ", "), cfg.ImageGCHighThreshold))
	}
	return out
}

// checkClock: the wall clock is set, and agrees with the time the agent
// saved in the state dir (a step since is absorbed by the agent's clock,
// but worth knowing).
func checkClock(now time.Time, markFile string) CheckResult {
	if now.Year() < 2024 {
		return failLine("clock", "wall clock %s is not set", now.UTC().Format(time.RFC3339))
	}
	wall := now.UTC().Format(time.RFC3339)
	if _, err := os.Stat(markFile); err != nil {
		return okLine("clock", "wall clock %s; no saved agent time (%s) yet", wall, markFile)
	}
	_, step := clock.Continue(nil, markFile)
	if step != 0 {
		return warnLine("clock", "wall clock %s is %s off the time the agent saved (%s): it stepped; the agent's ages go on from its own time",
			wall, step.Round(time.Second), markFile)
	}
	return okLine("clock", "wall clock %s; agrees with the agent's saved time (or that is of another boot)", wall)
}
