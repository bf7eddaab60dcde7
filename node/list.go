package node

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/gcagent/gcagent/events"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// List takes a full picture of namespace ns, as a listing after a start
// does (it takes what KnownContainer knows).
func (s *Source) List(ctx context.Context, ns string) (events.Listing, error) {
	l, _, err := s.list(ctx, ns, true)
	return l, err
}

// list lists namespace ns. unsure counts the CRI containers and sandboxes
// it found without a task whose state CRI could not tell yet (criStates):
// their state is left as it is, and another listing must follow.
func (s *Source) list(ctx context.Context, ns string, useKnown bool) (l events.Listing, unsure int, err error) {
	ctx = namespaces.WithNamespace(ctx, ns)
	began := time.Now()
	defer func() { s.m.listSeconds.Observe(time.Since(began).Seconds()) }()
	at := s.o.Now().UTC()

	// The images, the containers with their snapshots, and the tasks are
	// listed at once: containerd serves one while the agent decodes
	// another. The events that follow the listing repair what changed
	// meanwhile, whatever the order. The listing's events are made as the
	// records are decoded, and completed once all are in: a busy node's
	// listing is the agent's largest piece of memory, held once.
	l = events.Listing{At: at}
	var (
		targets      []imageTarget     // of l.Images
		ctrs         []listedContainer // of l.Containers
		snapshotters []string
		ix           snapshotIndex
		tasks        *tasksapi.ListTasksResponse
	)
	lists, lctx := errgroup.WithContext(ctx)
	lists.Go(func() (err error) {
		if l.Images, targets, err = s.listImages(lctx); err != nil {
			return fmt.Errorf("list images: %w", err)
		}
		return nil
	})
	lists.Go(func() (err error) {
		var known *ContainerFacts // of the record being streamed
		if err = s.streamContainers(lctx, func(c *containers.Container) bool {
			known = s.knownContainer(ns, at, c, useKnown)
			return known == nil
		}, func(c containers.Container) {
			ev, lc := s.slim(ns, at, c, known)
			l.Containers, ctrs = append(l.Containers, ev), append(ctrs, lc)
		}); err != nil {
			return fmt.Errorf("list containers: %w", err)
		}
		snapshotters = []string{defaultSnapshotter}
		for _, lc := range ctrs {
			snapshotters = append(snapshotters, lc.snapshotter)
		}
		slices.Sort(snapshotters)
		snapshotters = slices.Compact(snapshotters)
		ix, err = s.walkSnapshots(lctx, snapshotters)
		return err
	})
	lists.Go(func() (err error) {
		if tasks, err = s.o.Client.TaskService().List(lctx, &tasksapi.ListTasksRequest{}); err != nil {
			return fmt.Errorf("list tasks: %w", err)
		}
		return nil
	})
	if err := lists.Wait(); err != nil {
		return events.Listing{}, 0, err
	}

	// Images by name, as indexes into l.Images.
	byName := make(map[string]int, len(l.Images))
	// Facts the projection holds (a restart) cost nothing; the others come
	// from one listing of the content store's labels, or are read once per
	// target digest (names share them), listingLookups at a time.
	facts := make(map[string]ImageFacts, len(l.Images)) // by target digest
	var (
		unknown []int // of l.Images
		cix     *contentIndex
	)
	for i := range l.Images {
		d := l.Images[i].Digest
		byName[l.Images[i].Name] = i
		if _, seen := facts[d]; seen {
			continue
		}
		f, ok := s.knownFacts(d)
		facts[d] = f
		if !ok {
			unknown = append(unknown, i)
		}
	}
	if len(unknown) > 0 {
		cix = s.listContent(ctx, snapshotters)
		read := make([]ImageFacts, len(unknown))
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(listingLookups)
		for i, j := range unknown {
			img := targets[j].image(l.Images[j])
			known := facts[l.Images[j].Digest]
			g.Go(func() error {
				read[i] = s.readFacts(gctx, img, known, cix)
				return nil
			})
		}
		_ = g.Wait()
		for i, j := range unknown {
			facts[l.Images[j].Digest] = read[i]
		}
	}
	targets = nil
	for i := range l.Images {
		ev := &l.Images[i]
		f := facts[ev.Digest]
		ev.At, ev.Size, ev.ConfigDigest, ev.ChainID = at, f.Size, f.Config, f.Chain
	}

	anc := listingAncestry(ix, facts, cix, func(ctx context.Context) *contentIndex { return s.listContent(ctx, snapshotters) })
	rootOf := func(snapshotter, key string) string {
		chain, _ := anc.rootChain(ctx, snapshotter, key) // the index answers without error
		return chain
	}
	volumesOf := func(sb string) []string { return ix.volumes[sb] }
	configOf := s.configOf(ctx, func(name string) (string, bool) {
		i, ok := byName[name]
		if !ok {
			return "", false
		}
		return l.Images[i].ConfigDigest, true
	})
	for i, lc := range ctrs {
		ev := &l.Containers[i]
		if j, ok := byName[ev.Image]; ok {
			ev.ImageDigest = l.Images[j].Digest
		}
		if lc.known != nil {
			lc.known.fill(ev)
		} else {
			criFacts(ev, lc.imageID, lc.volumes, configOf)
		}
		contentFacts(ev, lc.snapshotter, lc.snapshotKey, rootOf, volumesOf)
	}

	for _, p := range tasks.Tasks {
		id := p.ContainerID
		if id == "" {
			id = p.ID
		}
		t := events.Task{ContainerID: id, Pid: p.Pid, Status: taskStatus(p.Status), ExitStatus: p.ExitStatus}
		if p.ExitedAt != nil && t.Status == events.TaskStopped {
			t.ExitedAt = notAfter(s.skewed(p.ExitedAt.AsTime()), at)
		}
		l.Tasks = append(l.Tasks, t)
	}
	if ns == events.CRINamespace && s.o.CRI != nil {
		// CRI deletes an exited container's task and keeps the exit in its
		// own store: the tasks do not tell, CRI does. Asked after the
		// tasks were listed, so its answer is at least as new.
		unsure = s.criStates(ctx, &l)
	}
	return l, unsure, nil
}

// listedContainer is what a listing holds of a container record besides
// its event until the images are listed: a busy node's records are 10 KiB
// and more each (a CRI container's spec, its CRI metadata, its labels),
// and only a little of them is read.
type listedContainer struct {
	known *ContainerFacts // what the projection knows of it (KnownContainer), or nil
	// The refs CRI stored (criImageRefs), when not known.
	imageID string
	volumes []string
	// Its rootfs snapshot (snapshotterOf, the key; "" none).
	snapshotter, snapshotKey string
}

// slim converts c as far as a listing can before the images are listed
// (its event, all but the image digest and content facts), reading its
// spec and CRI metadata only when known (knownContainer) is nil; it keeps
// nothing of c's spec, extensions or labels.
func (s *Source) slim(ns string, at time.Time, c containers.Container, known *ContainerFacts) (events.ContainerUpserted, listedContainer) {
	lc := listedContainer{known: known, snapshotter: snapshotterOf(c), snapshotKey: c.SnapshotKey}
	ev := containerEventIn(ns, at, c, known)
	ev.Created = s.created(c, at)
	ev.RestartManaged = restartManaged(c.Labels)
	if known == nil {
		lc.imageID, lc.volumes = criImageRefs(c)
	}
	return ev, lc
}

// knownContainer is what the projection knows of CRI container c, when
// useKnown and the projection holds it with the same creation time; nil
// otherwise, and then the listing reads c's spec and CRI metadata.
func (s *Source) knownContainer(ns string, at time.Time, c *containers.Container, useKnown bool) *ContainerFacts {
	if !useKnown || ns != events.CRINamespace || c.Labels[labelCRIKind] != "container" {
		return nil
	}
	if f, ok := s.o.KnownContainer(ns, c.ID, s.created(*c, at)); ok {
		return &f
	}
	return nil
}

// created is c's creation time as the agent records it: containerd's
// stamp (skewed in tests), bounded by at, the time the agent learnt of it.
func (s *Source) created(c containers.Container, at time.Time) time.Time {
	return notAfter(s.skewed(c.CreatedAt.UTC()), at)
}

// imageTarget is what a listing holds of an image's target besides its
// event's digest, for the facts it may read.
type imageTarget struct {
	mediaType string
	size      int64
}

// image is the image record facts read: ev's name and its target.
func (t imageTarget) image(ev events.ImageUpserted) images.Image {
	return images.Image{Name: ev.Name, Target: ocispec.Descriptor{MediaType: t.mediaType, Digest: digest.Digest(ev.Digest), Size: t.size}}
}

// listImages lists the images of the namespace in ctx (listedImages): an
// event of each with its name, digest, labels and creation time, and its
// target.
func (s *Source) listImages(ctx context.Context) ([]events.ImageUpserted, []imageTarget, error) {
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		imgs, err := s.o.Client.ImageService().List(ctx)
		evs, targets := make([]events.ImageUpserted, len(imgs)), make([]imageTarget, len(imgs))
		for i, img := range imgs {
			evs[i] = imageEvent(time.Time{}, img, ImageFacts{})
			targets[i] = imageTarget{img.Target.MediaType, img.Target.Size}
		}
		return evs, targets, err
	}
	var m listedImages
	err := conn.Invoke(ctx, "/containerd.services.images.v1.Images/List", &imagesapi.ListImagesRequest{}, &m, grpc.ForceCodecV2(newListCodec()))
	if err != nil {
		return nil, nil, errgrpc.ToNative(err)
	}
	return m.evs, m.targets, nil
}

// streamContainers calls each with every container record of the
// namespace in ctx, as containerd streams them one message each (a daemon
// without ListStream sends one message of them all). Each record comes
// with its spec and CRI metadata only if bodies, called just before each
// with the rest of it, wants them; each must not keep them (they are the
// stream's buffer).
func (s *Source) streamContainers(ctx context.Context, bodies func(*containers.Container) bool, each func(containers.Container)) error {
	all := func() error {
		ctrs, err := s.o.Client.ContainerService().List(ctx)
		for _, c := range ctrs {
			bodies(&c) // read anyway
			each(c)
		}
		return err
	}
	conn, ok := s.o.Client.Conn().(grpc.ClientConnInterface)
	if !ok {
		return all()
	}
	stream, err := containersapi.NewContainersClient(conn).ListStream(ctx, &containersapi.ListContainersRequest{}, grpc.ForceCodecV2(newListCodec()))
	if err != nil {
		return errgrpc.ToNative(err)
	}
	m := streamedContainer{bodies: bodies, each: each}
	for n := 0; ; n++ {
		err := stream.RecvMsg(&m)
		switch {
		case err == io.EOF:
			return nil
		case n == 0 && status.Code(err) == codes.Unimplemented:
			return all()
		case err != nil:
			return errgrpc.ToNative(err)
		}
	}
}

// listingLookups bounds the per-item calls a listing has in flight: image
// facts it must read, exit statuses it asks CRI.
const listingLookups = 8

// criStates adds to l, for each CRI container and sandbox it lists without
// a task, what CRI knows of it: exited (a stopped Task, with the exit code
// and time CRI keeps for a container), never started (nothing: created),
// or neither. Neither is CRI's own window (its exit handler deletes the
// task before it records the exit) or a CRI that cannot answer now: the
// listing then holds a Task of unknown status, which keeps whatever state
// the projection holds (never an exit status guessed), and the count of
// them is returned so that another listing follows. A container or
// sandbox CRI does not know (not loaded, being created, no CRI plugin)
// gets nothing. Containers are asked one at a time (listingLookups in
// flight): a list of exited ones may be over the runtime's send limit,
// and only a container's status has its exit code.
func (s *Source) criStates(ctx context.Context, l *events.Listing) (unsure int) {
	hasTask := make(map[string]bool, len(l.Tasks))
	for _, t := range l.Tasks {
		hasTask[t.ContainerID] = true
	}
	var ctrs, sbs []string
	for _, c := range l.Containers {
		switch {
		case hasTask[c.ID]:
		case c.CRIKind == "container":
			ctrs = append(ctrs, c.ID)
		case c.CRIKind == "sandbox":
			sbs = append(sbs, c.ID)
		}
	}
	tasks := make([]events.Task, len(ctrs))
	errs := make([]error, len(ctrs))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listingLookups)
	for i, id := range ctrs {
		g.Go(func() error {
			tasks[i], errs[i] = s.criContainerTask(gctx, id, l.At)
			return nil
		})
	}
	_ = g.Wait()
	var failed int
	var first error
	for _, err := range errs {
		if err != nil {
			failed++
			first = cmp.Or(first, err)
		}
	}
	if failed > 0 {
		s.o.Log.Warn().Err(first).Int("containers", failed).
			Msg("CRI cannot tell the state of containers without a task: their state is kept until it can")
	}
	if len(sbs) > 0 {
		sbTasks, err := s.criSandboxTasks(ctx, sbs, l.At)
		if err != nil {
			s.o.Log.Warn().Err(err).Int("sandboxes", len(sbs)).
				Msg("CRI cannot tell the state of sandboxes without a task: their state is kept until it can")
		}
		tasks = append(tasks, sbTasks...)
	}
	for _, t := range tasks {
		switch t.Status {
		case "":
			continue // CRI does not know it, or never started it
		case events.TaskUnknown:
			unsure++
		}
		l.Tasks = append(l.Tasks, t)
	}
	return unsure
}

// criContainerTask is what CRI says of container id, which has no task:
// stopped (exited, with its code and time), none ("" status: never
// started, or not known to CRI), or unknown (CRI says it runs, or cannot
// answer: then with the error).
func (s *Source) criContainerTask(ctx context.Context, id string, at time.Time) (events.Task, error) {
	none, unknown := events.Task{ContainerID: id}, events.Task{ContainerID: id, Status: events.TaskUnknown}
	st, err := s.o.CRI.ContainerStatus(ctx, &runtime.ContainerStatusRequest{ContainerId: id})
	switch {
	case ctrNotFound(err) || status.Code(err) == codes.Unimplemented:
		return none, nil
	case err != nil:
		return unknown, fmt.Errorf("cri container status %q: %w", id, err)
	case st.GetStatus() == nil:
		return unknown, fmt.Errorf("cri container status %q: no status", id)
	}
	switch st.Status.State {
	case runtime.ContainerState_CONTAINER_CREATED:
		return none, nil
	case runtime.ContainerState_CONTAINER_EXITED:
		t := events.Task{ContainerID: id, Status: events.TaskStopped, ExitStatus: uint32(st.Status.ExitCode), ExitedAt: at}
		if st.Status.FinishedAt > 0 {
			t.ExitedAt = notAfter(s.skewed(time.Unix(0, st.Status.FinishedAt)), at)
		}
		return t, nil
	}
	return unknown, nil
}

// criSandboxTasks is what CRI says of sandboxes ids, which have no task,
// in their order: stopped when not ready, none when CRI does not know one,
// unknown when CRI says it is ready (its exit handler deletes the task
// first) or cannot answer (then with the error).
func (s *Source) criSandboxTasks(ctx context.Context, ids []string, at time.Time) ([]events.Task, error) {
	out := make([]events.Task, len(ids))
	resp, err := s.o.CRI.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if status.Code(err) == codes.Unimplemented {
		resp, err = &runtime.ListPodSandboxResponse{}, nil
	}
	state := make(map[string]runtime.PodSandboxState, len(resp.GetItems()))
	for _, p := range resp.GetItems() {
		state[p.Id] = p.State
	}
	for i, id := range ids {
		st, known := state[id]
		switch {
		case err != nil:
			out[i] = events.Task{ContainerID: id, Status: events.TaskUnknown}
		case !known:
			out[i] = events.Task{ContainerID: id}
		case st == runtime.PodSandboxState_SANDBOX_NOTREADY:
			out[i] = events.Task{ContainerID: id, Status: events.TaskStopped, ExitedAt: at}
		default:
			out[i] = events.Task{ContainerID: id, Status: events.TaskUnknown}
		}
	}
	if err != nil {
		return out, fmt.Errorf("cri sandboxes: %w", err)
	}
	return out, nil
}

func taskStatus(st tasktypes.Status) events.TaskStatus {
	switch st {
	case tasktypes.Status_CREATED:
		return events.TaskCreated
	case tasktypes.Status_RUNNING:
		return events.TaskRunning
	case tasktypes.Status_STOPPED:
		return events.TaskStopped
	case tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		return events.TaskPaused
	}
	return events.TaskUnknown
}
