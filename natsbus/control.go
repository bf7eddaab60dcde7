package natsbus

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
)

// Control verbs: the last token of a control subject.
const (
	// VerbStatus asks for the node's projection summary, disk and outbox.
	VerbStatus = "status"
	// VerbPlan asks for the dry-run GC plan of the node as it is now.
	VerbPlan = "plan"
	// VerbExplain asks why one image is kept or would go; args {"image": name or digest}.
	VerbExplain = "explain"
	// VerbGC asks the node to run an image GC pass now; refused unless the
	// node allows remote GC.
	VerbGC = "gc"
)

// Verbs lists the control verbs in a stable order.
var Verbs = []string{VerbStatus, VerbPlan, VerbExplain, VerbGC}

// Control defaults; a zero field in ControlOptions takes these.
const (
	// MaxRequestBytes bounds a control request's payload; larger ones get an error reply.
	MaxRequestBytes = 64 << 10
	// MaxRequestIDBytes bounds a request id.
	MaxRequestIDBytes = 128
	// DefaultControlTimeout bounds one request's handling.
	DefaultControlTimeout = 2 * time.Minute
	// DefaultReadConcurrency is how many requests of one read verb run at once.
	DefaultReadConcurrency = 4
)

// HeaderCaller names the caller of a control request, as the caller declares
// it: gcagent's tools put their NATS connection name there. It is not
// authenticated; Nats-Request-Info (set by the server) is.
const HeaderCaller = "Gcagent-Caller"

// HeaderRequestInfo is the header nats-server sets, overwriting any value a
// client sent, on a request that reaches this account through a service
// import; with the import's share option it names the caller's account,
// user and connection. Within one account a client could set it itself.
const HeaderRequestInfo = "Nats-Request-Info"

// ErrRemoteGCDisabled is the error of a gc request to a node that does not allow remote GC.
var ErrRemoteGCDisabled = errors.New("remote gc is disabled on this node (start the agent with --allow-remote-gc)")

// Handler answers control requests; cmd/gcagent implements it over the
// running agent. Each method returns the reply's data, which must marshal
// to JSON, or an error whose text becomes the reply's error. Methods are
// called concurrently with each other (GC never with itself) and must
// return when ctx ends.
type Handler interface {
	// Status summarizes the projection, the disk and the outbox.
	Status(ctx context.Context) (any, error)
	// Plan returns the dry-run GC plan as of now; it deletes nothing.
	Plan(ctx context.Context) (any, error)
	// Explain says why the image named image (a name or digest) is kept or would go.
	Explain(ctx context.Context, image string) (any, error)
	// GC runs a GC pass now and returns its result.
	GC(ctx context.Context) (any, error)
}

// ControlRequest is a control request's payload.
type ControlRequest struct {
	// ID identifies the request in replies and logs; required, at most MaxRequestIDBytes.
	ID string `json:"id"`
	// Args are the verb's arguments: {"image": "..."} for explain, none for the others.
	Args json.RawMessage `json:"args,omitempty"`
}

// ExplainArgs are the arguments of an explain request.
type ExplainArgs struct {
	// Image is an image name (example.test/app:1) or digest (sha256:...).
	Image string `json:"image"`
}

// ControlReply is a control reply's payload. OK is false exactly when Error is set.
type ControlReply struct {
	ID    string          `json:"id"`
	Node  string          `json:"node"`
	Verb  string          `json:"verb"`
	OK    bool            `json:"ok"`
	Error string          `json:"error,omitempty"`
	Data  json.RawMessage `json:"data,omitempty"`
}

// ControlOptions configures ServeControl.
type ControlOptions struct {
	// Cluster and Node name the subjects served:
	// gcagent.v1.ctl.<cluster>.<node>.> and gcagent.v1.ctl.<cluster>.all.>.
	// Cluster defaults to "default"; Node is required.
	Cluster, Node string
	// AllowRemoteGC lets gc requests run; without it they get ErrRemoteGCDisabled. Default false.
	AllowRemoteGC bool
	// Timeout bounds one request's handling. Default 2m.
	Timeout time.Duration
	// ReadConcurrency is how many requests of each read verb (status, plan,
	// explain) run at once; more get a busy error reply. gc always runs one
	// at a time. Default 4.
	ReadConcurrency int
	// Logger receives one line per request (component=control is added). Default: no logs.
	Logger zerolog.Logger
}

// controlError is an error the requester caused or may retry; its text goes
// into the reply as it is.
type controlError struct{ msg string }

func (e controlError) Error() string { return e.msg }

func badRequest(format string, a ...any) error { return controlError{fmt.Sprintf(format, a...)} }

// requesterError is a Handler's error that the request caused (RequesterError).
type requesterError struct{ error }

func (e requesterError) Unwrap() error { return e.error }

// RequesterError marks err, returned by a Handler, as the requester's
// doing (an unknown or ambiguous image: an operator's typo): the reply
// carries its text as usual, and the request is logged at info, not as an
// error of the agent. Nil stays nil.
func RequesterError(err error) error {
	if err == nil {
		return nil
	}
	return requesterError{err}
}

// ServeControl answers control requests for opts.Node on nc until ctx ends,
// then unsubscribes and waits for the requests in progress, whose
// handlers' context ends with ctx. Every request gets
// one reply, an error reply when it is oversized, malformed, has no id,
// names an unknown verb or may not run (gc without AllowRemoteGC, or busy);
// such requests call no Handler method. Every request is logged once with
// its id, verb, caller and outcome. It fails when it cannot subscribe.
func ServeControl(ctx context.Context, nc *nats.Conn, h Handler, opts ControlOptions) error {
	if opts.Cluster == "" {
		opts.Cluster = DefaultCluster
	}
	if opts.Node == "" {
		return errors.New("natsbus: control needs a node name")
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultControlTimeout
	}
	if opts.ReadConcurrency <= 0 {
		opts.ReadConcurrency = DefaultReadConcurrency
	}
	c := &control{
		h: h, opts: opts, nc: nc,
		log:  opts.Logger.With().Str("component", "control").Logger(),
		sems: map[string]chan struct{}{},
	}
	for _, v := range Verbs {
		n := opts.ReadConcurrency
		if v == VerbGC {
			n = 1
		}
		c.sems[v] = make(chan struct{}, n)
	}
	c.ctx = ctx // handlers stop with ServeControl
	var subs []*nats.Subscription
	for _, node := range []string{opts.Node, AllNodes} {
		subj := ControlPrefix + "." + SafeToken(opts.Cluster) + "." + SafeToken(node) + ".>"
		sub, err := nc.Subscribe(subj, c.serve)
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return fmt.Errorf("natsbus: subscribe %s: %w", subj, err)
		}
		subs = append(subs, sub)
	}
	c.log.Info().Bool("allow_remote_gc", opts.AllowRemoteGC).
		Msg("answering control requests")
	<-ctx.Done()
	for _, s := range subs {
		_ = s.Unsubscribe()
	}
	c.mu.Lock()
	c.closed = true // a callback still in flight replies an error instead of starting
	c.mu.Unlock()
	// Handlers in progress see ctx end; each still replies (with its error).
	c.wg.Wait()
	return nil
}

type control struct {
	h    Handler
	opts ControlOptions
	nc   *nats.Conn
	log  zerolog.Logger
	ctx  context.Context
	sems map[string]chan struct{} // per verb: a slot per request running

	mu     sync.Mutex // orders wg.Add before wg.Wait
	closed bool
	wg     sync.WaitGroup
}

// caller is who sent a request, as far as the headers tell.
type caller struct {
	declared string // Gcagent-Caller
	account  string // from Nats-Request-Info
	user     string
	name     string
}

func callerOf(m *nats.Msg) caller {
	var c caller
	if m.Header == nil {
		return c
	}
	c.declared = m.Header.Get(HeaderCaller)
	if ri := m.Header.Get(HeaderRequestInfo); ri != "" {
		var info struct {
			Account string `json:"acc"`
			User    string `json:"user"`
			Name    string `json:"name"`
		}
		if json.Unmarshal([]byte(ri), &info) == nil {
			c.account, c.user, c.name = info.Account, info.User, info.Name
		}
	}
	return c
}

// serve handles one request on the subscription's goroutine: it validates
// and admits the request, then runs the handler on its own goroutine so
// that a slow plan does not hold up a status.
func (c *control) serve(m *nats.Msg) {
	start := time.Now()
	verb := strings.TrimPrefix(m.Subject, ControlPrefix+".")
	if parts := strings.SplitN(verb, ".", 3); len(parts) == 3 {
		verb = parts[2] // cluster.node.verb...
	}
	who := callerOf(m)
	req, args, err := c.parse(m, verb)
	if err == nil {
		var release func()
		if release, err = c.admit(verb); err == nil {
			c.mu.Lock()
			if c.closed {
				c.mu.Unlock()
				release()
				c.reply(m, req.ID, verb, who, nil, badRequest("shutting down; nothing was started"), start)
				return
			}
			c.wg.Add(1)
			c.mu.Unlock()
			go func() {
				defer c.wg.Done()
				defer release()
				data, err := c.run(verb, args)
				c.reply(m, req.ID, verb, who, data, err, start)
			}()
			return
		}
	}
	c.reply(m, req.ID, verb, who, nil, err, start)
}

// parse checks the request; it returns the request (with as much of the id
// as could be read, to echo it), the verb's arguments, or a controlError.
func (c *control) parse(m *nats.Msg, verb string) (ControlRequest, any, error) {
	var req ControlRequest
	if len(m.Data) > MaxRequestBytes {
		return req, nil, badRequest("request is %d bytes, more than the %d allowed", len(m.Data), MaxRequestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(m.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		req = ControlRequest{}
		return req, nil, badRequest("malformed request: want {\"id\": \"...\", \"args\": {...}}: %v", err)
	}
	if dec.More() {
		req = ControlRequest{}
		return req, nil, badRequest("malformed request: trailing data after the JSON object")
	}
	switch {
	case req.ID == "":
		return req, nil, badRequest("request has no id")
	case len(req.ID) > MaxRequestIDBytes || !utf8.ValidString(req.ID) || !printable(req.ID):
		req.ID = ""
		return req, nil, badRequest("request id must be printable and at most %d bytes", MaxRequestIDBytes)
	}
	if _, ok := c.sems[verb]; !ok {
		return req, nil, badRequest("unknown verb %q (want one of %s)", verb, strings.Join(Verbs, ", "))
	}
	raw := bytes.TrimSpace(req.Args)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = []byte("{}")
	}
	args := bytes.NewReader(raw)
	if verb == VerbExplain {
		var a ExplainArgs
		d := json.NewDecoder(args)
		d.DisallowUnknownFields()
		if err := d.Decode(&a); err != nil {
			return req, nil, badRequest("malformed explain args: want {\"image\": \"name or digest\"}: %v", err)
		}
		if strings.TrimSpace(a.Image) == "" {
			return req, nil, badRequest("explain needs args {\"image\": \"name or digest\"}")
		}
		return req, a, nil
	}
	var none struct{}
	d := json.NewDecoder(args)
	d.DisallowUnknownFields()
	if err := d.Decode(&none); err != nil {
		return req, nil, badRequest("%s takes no args: %v", verb, err)
	}
	return req, nil, nil
}

// admit takes a slot of the verb or says why it cannot run now.
func (c *control) admit(verb string) (func(), error) {
	if verb == VerbGC && !c.opts.AllowRemoteGC {
		return nil, controlError{ErrRemoteGCDisabled.Error()}
	}
	sem := c.sems[verb]
	select {
	case sem <- struct{}{}:
		return func() { <-sem }, nil
	default:
		if verb == VerbGC {
			return nil, badRequest("busy: a gc requested earlier is still running; nothing was started")
		}
		return nil, badRequest("busy: %d %s requests are running; retry later", cap(sem), verb)
	}
}

func (c *control) run(verb string, args any) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.Timeout)
	defer cancel()
	var v any
	var err error
	switch verb {
	case VerbStatus:
		v, err = c.h.Status(ctx)
	case VerbPlan:
		v, err = c.h.Plan(ctx)
	case VerbExplain:
		v, err = c.h.Explain(ctx, args.(ExplainArgs).Image)
	case VerbGC:
		v, err = c.h.GC(ctx)
	}
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("marshal %s reply: %w", verb, err)
	}
	return b, nil
}

// reply sends the reply (if the request has a reply subject) and logs the request once.
func (c *control) reply(m *nats.Msg, id, verb string, who caller, data json.RawMessage, err error, start time.Time) {
	r := ControlReply{ID: id, Node: c.opts.Node, Verb: verb, OK: err == nil, Data: data}
	if err != nil {
		r.Error = err.Error()
		r.Data = nil
	}
	b, merr := json.Marshal(r)
	if merr == nil && int64(len(b)) > c.nc.MaxPayload() && c.nc.MaxPayload() > 0 {
		r.OK, r.Data = false, nil
		r.Error = fmt.Sprintf("reply of %d bytes is larger than the NATS max payload %d; ask the node locally (gcagent plan)", len(b), c.nc.MaxPayload())
		err = errors.New(r.Error)
		b, merr = json.Marshal(r)
	}
	var serr error
	switch {
	case merr != nil:
		serr = merr
	case m.Reply == "":
		serr = errors.New("request has no reply subject")
	default:
		serr = m.Respond(b)
	}
	// What the requester caused (a typo, a refused or busy verb) is no
	// fault of the agent: info, like a request that worked.
	lvl := zerolog.InfoLevel
	var ce controlError
	var re requesterError
	switch {
	case serr != nil:
		lvl = zerolog.ErrorLevel
	case err == nil, errors.As(err, &ce), errors.As(err, &re):
	default:
		lvl = zerolog.ErrorLevel
	}
	ev := c.log.WithLevel(lvl).Str("request_id", id).Str("verb", verb).Str("subject", m.Subject).
		Str("caller", who.declared).Bool("ok", r.OK).Float64("took_s", time.Since(start).Seconds())
	if who.account != "" || who.user != "" || who.name != "" {
		ev = ev.Str("caller_account", who.account).Str("caller_user", who.user).Str("caller_name", who.name)
	}
	if err != nil {
		ev = ev.Str("error", err.Error())
	}
	if serr != nil {
		ev = ev.AnErr("reply_error", serr)
	}
	ev.Msg("control request")
}

// RequestOptions configures Request and RequestAll.
type RequestOptions struct {
	// ID is the request id. Default: a random one.
	ID string
	// Args are the verb's arguments (ExplainArgs for explain). Default none.
	Args any
	// Caller goes into the Gcagent-Caller header. Default: the connection's name.
	Caller string
	// Quiet, for RequestAll, ends the wait that long after the last reply
	// once one came in: a fleet's nodes answer within milliseconds of each
	// other. Default 0: wait for want replies or the context.
	Quiet time.Duration
}

func newRequestMsg(nc *nats.Conn, subject string, o RequestOptions) (*nats.Msg, string, error) {
	if o.ID == "" {
		o.ID = strings.TrimPrefix(randomKey(), "rand/")
	}
	req := ControlRequest{ID: o.ID}
	if o.Args != nil {
		b, err := json.Marshal(o.Args)
		if err != nil {
			return nil, "", fmt.Errorf("natsbus: marshal request args: %w", err)
		}
		req.Args = b
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, "", err
	}
	m := nats.NewMsg(subject)
	m.Data = b
	if o.Caller == "" {
		o.Caller = nc.Opts.Name
	}
	if o.Caller != "" {
		m.Header.Set(HeaderCaller, o.Caller)
	}
	m.Header.Set(HeaderSchema, Schema)
	return m, o.ID, nil
}

// Request sends a control request for verb to one node of cluster and
// waits for its reply until ctx ends. It fails when nobody answers
// (nats.ErrNoResponders), ctx ends first, or the reply is not a ControlReply; a
// reply with OK false is returned without error.
func Request(ctx context.Context, nc *nats.Conn, cluster, node, verb string, o RequestOptions) (ControlReply, error) {
	m, _, err := newRequestMsg(nc, ControlSubject(cluster, node, verb), o)
	if err != nil {
		return ControlReply{}, err
	}
	resp, err := nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return ControlReply{}, fmt.Errorf("natsbus: %s request to %s: %w", verb, node, err)
	}
	var r ControlReply
	if err := json.Unmarshal(resp.Data, &r); err != nil {
		return ControlReply{}, fmt.Errorf("natsbus: %s reply from %s: %w", verb, node, err)
	}
	return r, nil
}

// RequestAll sends a control request for verb to every node of cluster
// (gcagent.v1.ctl.<cluster>.all.<verb>) and collects replies until ctx ends,
// want replies arrived (want <= 0: any number), or o.Quiet passed since the
// last one. It returns the replies in arrival order; it fails when the
// request cannot be sent, or with nats.ErrNoResponders when the server says
// nobody subscribes to the subject.
func RequestAll(ctx context.Context, nc *nats.Conn, cluster, verb string, want int, o RequestOptions) ([]ControlReply, error) {
	m, _, err := newRequestMsg(nc, ControlSubject(cluster, AllNodes, verb), o)
	if err != nil {
		return nil, err
	}
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("natsbus: subscribe %s: %w", inbox, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m.Reply = inbox
	if err := nc.PublishMsg(m); err != nil {
		return nil, fmt.Errorf("natsbus: %s request to all: %w", verb, err)
	}
	var out []ControlReply
	for want <= 0 || len(out) < want {
		wctx, cancel := ctx, context.CancelFunc(func() {})
		if o.Quiet > 0 && len(out) > 0 {
			wctx, cancel = context.WithTimeout(ctx, o.Quiet)
		}
		resp, err := sub.NextMsgWithContext(wctx)
		cancel()
		if errors.Is(err, nats.ErrNoResponders) && len(out) == 0 {
			return nil, fmt.Errorf("natsbus: %s request to all: %w", verb, err)
		}
		if err != nil {
			break
		}
		var r ControlReply
		if json.Unmarshal(resp.Data, &r) == nil {
			out = append(out, r)
		}
	}
	return out, nil
}
