package node

import (
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
	return s.list(ctx, ns, true)
}

func (s *Source) list(ctx context.Context, ns string, useKnown bool) (events.Listing, error) {
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
	l := events.Listing{At: at}
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
	// What CRI reports exited, for criExits: CRI deletes an exited
	// container's task, so the tasks do not tell.
	var (
		exited  map[string]bool
		askEach bool
	)
	if ns == events.CRINamespace && s.o.CRI != nil {
		lists.Go(func() error {
			exited, askEach = s.criExited(lctx)
			return nil
		})
	}
	if err := lists.Wait(); err != nil {
		return events.Listing{}, err
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
	if exited != nil {
		s.criExits(ctx, &l, exited, askEach)
	}
	return l, nil
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

// criExited lists what CRI reports exited: containers and sandboxes. CRI
// errors give none: such containers then count as never started, which
// keeps them. Only a missing CRI plugin goes unsaid. A list of exited
// containers over the runtime's send limit (CRIContainers) sets askEach
// instead: criExits then asks each CRI container without a task.
func (s *Source) criExited(ctx context.Context) (exited map[string]bool, askEach bool) {
	exited = map[string]bool{}
	failed := func(what string, err error) bool {
		if err != nil && status.Code(err) != codes.Unimplemented {
			s.o.Log.Warn().Err(err).Str("list", what).Msg("CRI list failed: exited containers without a task are kept until it works")
		}
		return err != nil
	}
	ctrs, err := CRIContainers(ctx, s.o.CRI, &runtime.ContainerFilter{State: &runtime.ContainerStateValue{State: runtime.ContainerState_CONTAINER_EXITED}})
	switch {
	case status.Code(err) == codes.ResourceExhausted:
		s.o.Log.Info().Err(err).Msg("CRI's list of exited containers is over its send limit: each container without a task is asked instead")
		askEach = true
	case !failed("exited containers", err):
		for _, c := range ctrs {
			exited[c.Id] = true
		}
	}
	sbs, err := s.o.CRI.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{
		Filter: &runtime.PodSandboxFilter{State: &runtime.PodSandboxStateValue{State: runtime.PodSandboxState_SANDBOX_NOTREADY}},
	})
	if !failed("not-ready sandboxes", err) {
		for _, p := range sbs.Items {
			exited[p.Id] = true
		}
	}
	return exited, askEach
}

// criExits adds a stopped Task for each CRI container or sandbox of the
// listing that exited (criExited) and has no task left, with the exit code
// and time CRI keeps for a container (asked listingLookups at a time).
// With askEach, every CRI container without a task is asked, and stopped
// when CRI says it exited.
func (s *Source) criExits(ctx context.Context, l *events.Listing, exited map[string]bool, askEach bool) {
	hasTask := make(map[string]bool, len(l.Tasks))
	for _, t := range l.Tasks {
		hasTask[t.ContainerID] = true
	}
	type exit struct {
		events.Task
		confirmed bool // exited per the list, or per its status when asked
	}
	var (
		stopped []exit
		ask     []int // the containers' (not sandboxes') among them
	)
	for _, c := range l.Containers {
		if c.CRIKind == "" || hasTask[c.ID] || !(exited[c.ID] || askEach && c.CRIKind == "container") {
			continue
		}
		if c.CRIKind == "container" {
			ask = append(ask, len(stopped))
		}
		stopped = append(stopped, exit{events.Task{ContainerID: c.ID, Status: events.TaskStopped, ExitedAt: l.At}, exited[c.ID]})
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listingLookups)
	for _, i := range ask {
		t := &stopped[i]
		g.Go(func() error {
			st, err := s.o.CRI.ContainerStatus(gctx, &runtime.ContainerStatusRequest{ContainerId: t.ContainerID})
			if err == nil && st.Status != nil {
				t.confirmed = t.confirmed || st.Status.State == runtime.ContainerState_CONTAINER_EXITED
				t.ExitStatus = uint32(st.Status.ExitCode)
				if st.Status.FinishedAt > 0 {
					t.ExitedAt = notAfter(s.skewed(time.Unix(0, st.Status.FinishedAt)), l.At)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	for _, t := range stopped {
		if t.confirmed {
			l.Tasks = append(l.Tasks, t.Task)
		}
	}
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
