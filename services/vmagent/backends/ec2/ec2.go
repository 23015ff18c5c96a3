// Package ec2 is the backend that runs each attempt on its own EC2 instance.
//
// One agent drives one fleet. Every instance is launched by one RunInstances
// call (MinCount = MaxCount = 1) that carries, in the call itself:
//
//   - a ClientToken derived from the attempt id, so that a call retried by
//     the SDK, or a Create run again for the same attempt, launches at most
//     one instance (EC2 "Ensuring idempotency": a repeated request with the
//     same token returns the first request's instance);
//   - TagSpecifications for the instance and its volumes (berth:attempt,
//     berth:pool, berth:fleet, Name = attempt id, plus configured extras),
//     so that nothing this backend creates ever exists untagged (law 4);
//   - the JIT config, inside user data rendered from a template.
//
// Instance types (the shape's, when the attempt's pool declares a machine shape
// with instance types; its image replaces the AMI), subnets and (with spot)
// the market are tried in order:
// InsufficientInstanceCapacity and its kin move on to the next combination
// instead of failing the attempt. Each combination has its own ClientToken
// (attempt id + "-" + 8 hex digits of a hash of fleet, market, type and
// subnet): EC2 answers IdempotentParameterMismatch when a token is reused
// with different parameters, and a per-combination token keeps a retry of
// the same combination idempotent.
//
// Stop terminates the attempt's instances; List reads the fleet's instances
// by tag. Throttling (RequestLimitExceeded) is retried by the SDK's standard
// retryer, bounded by MaxAttempts and by the deadline the agent gives every
// call, with jittered exponential back-off that every call of the backend
// shares: a throttle answered to one call holds back all (backoff.go).
package ec2

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	sdk "github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/vmagent/backend"
)

// Tag keys set on every instance and volume.
const (
	TagAttempt = "berth:attempt"
	TagPool    = "berth:pool"
	TagFleet   = "berth:fleet"
)

// Spot says which markets Create tries.
type Spot string

const (
	OnDemand   Spot = ""       // on-demand only
	SpotPrefer Spot = "prefer" // spot, then on-demand when no spot capacity is found
	SpotOnly   Spot = "only"   // spot only
)

// ErrNoCapacity is wrapped by a Create that tried every combination of
// market, instance type and subnet and found no capacity for any.
// It wraps backend.ErrBackend: capacity is charged to the backend, never to
// the job (law 11).
var ErrNoCapacity = fmt.Errorf("no EC2 capacity in any configured instance type, subnet and market: %w", backend.ErrBackend)

// Options configure a Backend. Region and Fleet are required, and
// LaunchTemplateID, LaunchTemplateName or AMI.
type Options struct {
	Region   string
	Endpoint string // EC2 endpoint URL override; "" means the region's
	Profile  string // shared-config profile; "" means the default chain

	LaunchTemplateID      string
	LaunchTemplateName    string
	LaunchTemplateVersion string // a number, $Latest or $Default ("" means $Default)
	AMI                   string

	InstanceTypes  []string // in order of preference; empty: the template's
	Subnets        []string // tried in order for each type; empty: the template's
	SecurityGroups []string // security group ids

	Spot         Spot
	SpotMaxPrice string // USD per hour; "" means the on-demand price

	Fleet string            // berth:fleet tag value
	Tags  map[string]string // extra tags on every instance and volume

	// UserData is a text/template rendered with UserDataFields; "" means
	// DefaultUserData. The result (at most 16 KiB, EC2's limit before
	// base64) is sent base64-encoded.
	UserData string

	// MaxAttempts per API call (the SDK retries throttling, 5xx and
	// connection errors) and MaxBackoff between attempts; 0 means 5 and 20s.
	MaxAttempts int
	MaxBackoff  time.Duration

	// NotFoundGrace: EC2 is eventually consistent, and a call naming an
	// instance launched moments ago may answer InvalidInstanceID.NotFound.
	// For this long after this backend launched an instance, NotFound on
	// terminate is an error (the agent tries the stop again) rather than
	// "gone". 0 means 5 min.
	NotFoundGrace time.Duration

	// Credentials and HTTPClient replace the default credential chain and
	// HTTP client (tests, unusual setups; with AWS_CA_BUNDLE set the SDK
	// refuses a client that is not its own); Now replaces time.Now.
	Credentials aws.CredentialsProvider
	HTTPClient  *http.Client
	Now         func() time.Time
	Logger      *slog.Logger
	// PageSize is DescribeInstances' MaxResults (5 to 1000; 0 means 1000).
	PageSize int32

	// AssignByRestart lets the host keep warm VMs (warm.go): a warm
	// instance boots once without a JIT config and powers off (stopped);
	// Assign writes the JIT config into its user data and starts it. The
	// image must run user data at every boot. PollEvery paces the wait for
	// a warm instance to stop (0 means 5 s).
	AssignByRestart bool
	PollEvery       time.Duration
}

// Backend implements backend.Backend on EC2.
type Backend struct {
	opts     Options
	client   *sdk.Client
	userData *template.Template
	ownHTTP  idleCloser // closed by Close; nil when the caller gave a client
	retryer  *sharedBackoff

	mu       sync.Mutex
	launched map[string]launch // attempt id → what Create launched
}

// launch is what Create learnt from RunInstances, so that Stop needs no
// (eventually consistent) lookup by tag.
type launch struct {
	ids []string
	at  time.Time
}

// forgetAfter bounds the launched map: past the consistency window an
// instance is found by tag, so an attempt that is never stopped costs at
// most this long of memory.
const forgetAfter = time.Hour

// New returns a backend whose API client is ready; it makes no API call.
func New(ctx context.Context, o Options) (*Backend, error) {
	if o.Region == "" || o.Fleet == "" {
		return nil, errors.New("ec2 backend: region and fleet are required")
	}
	if o.LaunchTemplateID == "" && o.LaunchTemplateName == "" && o.AMI == "" {
		return nil, errors.New("ec2 backend: give a launch template (id or name) or an AMI")
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 5
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 20 * time.Second
	}
	if o.NotFoundGrace <= 0 {
		o.NotFoundGrace = 5 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.PollEvery <= 0 {
		o.PollEvery = 5 * time.Second
	}
	if o.PageSize == 0 {
		o.PageSize = 1000
	}
	o.PageSize = min(max(o.PageSize, 5), 1000) // EC2's bounds for MaxResults
	if o.UserData == "" {
		o.UserData = DefaultUserData
	}
	tmpl, err := parseUserData(o.UserData)
	if err != nil {
		return nil, err
	}
	b := &Backend{opts: o, userData: tmpl, launched: map[string]launch{}}
	// One retryer for every call, so that a throttle seen by one holds
	// back all (sharedBackoff).
	b.retryer = newSharedBackoff(newRetryer(o.MaxAttempts, o.MaxBackoff), o.Now)

	loads := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(o.Region),
		awsconfig.WithRetryer(func() aws.Retryer { return b.retryer }),
	}
	if o.HTTPClient != nil {
		loads = append(loads, awsconfig.WithHTTPClient(o.HTTPClient))
	}
	if o.Profile != "" {
		loads = append(loads, awsconfig.WithSharedConfigProfile(o.Profile))
	}
	if o.Credentials != nil {
		loads = append(loads, awsconfig.WithCredentialsProvider(o.Credentials))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("ec2 backend: load AWS configuration: %w", err)
	}
	if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
		// The SDK's client, as the configuration left it (AWS_CA_BUNDLE,
		// for one, is applied to it), frozen so that this backend owns its
		// connection pool and Close can release it.
		cfg.HTTPClient = bc.Freeze()
		b.ownHTTP, _ = cfg.HTTPClient.(idleCloser)
	}
	b.client = sdk.NewFromConfig(cfg, func(co *sdk.Options) {
		if o.Endpoint != "" {
			co.BaseEndpoint = aws.String(o.Endpoint)
		}
	})
	return b, nil
}

// newRetryer is the SDK's standard retryer (it retries RequestLimitExceeded
// and the other throttling codes, 5xx answers and connection errors, with
// exponential backoff and jitter, each sleep ending with the call's
// context), except that capacity errors are not retried: EC2 answers
// InsufficientInstanceCapacity with HTTP 500, which the standard retryer
// would retry in place, while capacity does not come back within seconds and
// Create should move on to the next instance type or subnet at once.
func newRetryer(maxAttempts int, maxBackoff time.Duration) aws.RetryerV2 {
	return retry.NewStandard(func(so *retry.StandardOptions) {
		so.MaxAttempts = maxAttempts
		so.MaxBackoff = maxBackoff
		so.Retryables = append([]retry.IsErrorRetryable{noRetryOnCapacity{}}, so.Retryables...)
	})
}

// noRetryOnCapacity vetoes retries of the codes Create falls back on.
type noRetryOnCapacity struct{}

func (noRetryOnCapacity) IsErrorRetryable(err error) aws.Ternary {
	if _, ok := fallbacks[apiCode(err)]; ok {
		return aws.FalseTernary
	}
	return aws.UnknownTernary
}

type idleCloser interface{ CloseIdleConnections() }

// Close releases idle connections of the backend's own HTTP client.
func (b *Backend) Close() {
	if b.ownHTTP != nil {
		b.ownHTTP.CloseIdleConnections()
	}
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "ec2" }

// InMemoryJIT implements backend.InMemoryJIT: the JIT config goes into
// the instance's user data, so the host keeps no file of it.
func (b *Backend) InMemoryJIT() {}

// PhysicalCap implements backend.Backend: the cloud sets no per-host limit
// Berth can read (account quotas answer InsufficientInstanceCapacity or
// a limit error on create); the agent's physical_cap decides.
func (b *Backend) PhysicalCap() int { return 0 }

// CanAssign implements backend.Backend: with AssignByRestart the host keeps
// warm, stopped instances (warm.go); without it an instance gets its JIT
// config in its user data at launch only.
func (b *Backend) CanAssign() bool { return b.opts.AssignByRestart }

// fallback is what Create does after a RunInstances error.
type fallback int

const (
	nextCombination fallback = iota + 1 // try the next subnet or type
	nextType                            // skip this type's other subnets (limits are regional)
	nextMarket                          // skip the rest of this market (spot)
)

// fallbacks lists the EC2 error codes (EC2 API reference, "Error codes")
// that mean "not here, maybe elsewhere".
var fallbacks = map[string]fallback{
	// No capacity for this type in this zone (HTTP 500).
	"InsufficientInstanceCapacity": nextCombination,
	"InsufficientCapacity":         nextCombination,
	// The type is not offered in this zone (or with this market).
	"Unsupported": nextCombination,
	// The subnet has no free private address.
	"InsufficientFreeAddressesInSubnet": nextCombination,
	// Account limits are per region and per type family and market: another
	// subnet cannot help, another type may.
	"InstanceLimitExceeded": nextType,
	"VcpuLimitExceeded":     nextType,
	// Spot is exhausted or too dear: on to on-demand.
	"MaxSpotInstanceCountExceeded": nextMarket,
	"SpotMaxPriceTooLow":           nextMarket,
}

// combination is one RunInstances parameter set.
type combination struct {
	spot          bool
	itype, subnet string
}

func (c combination) String() string {
	s := c.itype
	if s == "" {
		s = "template type"
	}
	if c.subnet != "" {
		s += " in " + c.subnet
	}
	if c.spot {
		s += " (spot)"
	}
	return s
}

// plan lists the combinations in the order Create tries them: market, then
// type, then subnet. A shape's instance types replace the configured ones.
func (b *Backend) plan(shape *events.Shape) []combination {
	markets := []bool{false}
	switch b.opts.Spot {
	case SpotPrefer:
		markets = []bool{true, false}
	case SpotOnly:
		markets = []bool{true}
	}
	typesList := b.opts.InstanceTypes
	if shape != nil && len(shape.InstanceTypes) > 0 {
		typesList = shape.InstanceTypes
	}
	if len(typesList) == 0 {
		typesList = []string{""}
	}
	subnets := b.opts.Subnets
	if len(subnets) == 0 {
		subnets = []string{""}
	}
	var out []combination
	for _, spot := range markets {
		for _, t := range typesList {
			for _, s := range subnets {
				out = append(out, combination{spot: spot, itype: t, subnet: s})
			}
		}
	}
	return out
}

// ClientToken is the idempotency token of one attempt's launch with one
// combination: the attempt id, "-", and 8 hex digits of a hash of fleet,
// market, instance type and subnet. It is at most 64 ASCII characters (EC2's
// limit); an attempt id too long for that is itself replaced by a hash.
func ClientToken(attempt, fleet string, spot bool, itype, subnet string) string {
	market := "on-demand"
	if spot {
		market = "spot"
	}
	h := sha256.Sum256([]byte(fleet + "\x00" + market + "\x00" + itype + "\x00" + subnet))
	suffix := hex.EncodeToString(h[:4])
	if len(attempt)+1+len(suffix) > 64 {
		a := sha256.Sum256([]byte(attempt))
		attempt = hex.EncodeToString(a[:16])
	}
	return attempt + "-" + suffix
}

// Create implements backend.Backend: it launches one instance for vm and
// returns once EC2 has accepted it (state pending); the runner starts when
// the instance boots, and the watchdog's registration deadline covers a
// runner that never comes.
//
// Create first looks for an instance of this attempt (by tag) and adopts it,
// so that a Create run again after a launch whose reply was lost does not
// launch a second one with another combination. It then tries each
// combination in order; a capacity error moves on (see fallbacks), any other
// error, and the end of ctx, ends Create. After every combination failed for
// capacity it returns an error wrapping ErrNoCapacity.
func (b *Backend) Create(ctx context.Context, vm backend.VM) error {
	if vm.Warm && !b.opts.AssignByRestart {
		return fmt.Errorf("ec2 create %s: a warm VM needs assign_by_restart: %w", vm.Attempt, backend.ErrNoAssign)
	}
	userData, err := b.renderUserData(vm)
	if err != nil {
		return fmt.Errorf("ec2 create %s: %w", vm.Attempt, err)
	}
	if ids, err := b.find(ctx, vm.Attempt); err == nil && len(ids) > 0 {
		b.remember(vm.Attempt, ids)
		b.opts.Logger.Info("ec2: adopted the attempt's existing instance", "attempt", vm.Attempt, "instances", ids)
		return b.warmedUp(ctx, vm)
	} else if ctx.Err() != nil {
		return fmt.Errorf("ec2 create %s: %w", vm.Attempt, ctx.Err())
	} else if err != nil {
		// The launch's own token still keeps it idempotent.
		b.opts.Logger.Warn("ec2: could not look for an existing instance; launching", "attempt", vm.Attempt, "err", err)
	}
	var (
		misses     []string
		skipType   = map[string]bool{} // market/type
		skipMarket = map[bool]bool{}
	)
	for _, c := range b.plan(vm.Shape) {
		if skipMarket[c.spot] || skipType[fmt.Sprint(c.spot, "/", c.itype)] {
			continue
		}
		ids, err := b.run(ctx, vm, c, userData)
		if err == nil {
			b.remember(vm.Attempt, ids)
			b.opts.Logger.Info("ec2: launched", "attempt", vm.Attempt, "instances", ids, "as", c.String())
			return b.warmedUp(ctx, vm)
		}
		code := apiCode(err)
		if code == "IdempotentParameterMismatch" {
			// The token was used before with other parameters (the
			// configuration changed under a running attempt): whatever it
			// launched carries the attempt's tag.
			if ids, ferr := b.find(ctx, vm.Attempt); ferr == nil && len(ids) > 0 {
				b.remember(vm.Attempt, ids)
				return b.warmedUp(ctx, vm)
			}
			return fmt.Errorf("ec2 create %s (%s): %w", vm.Attempt, c, blame(err))
		}
		f, ok := fallbacks[code]
		if !ok || ctx.Err() != nil {
			return fmt.Errorf("ec2 create %s (%s): %w", vm.Attempt, c, blame(err))
		}
		misses = append(misses, c.String()+": "+code)
		b.opts.Logger.Info("ec2: no capacity, trying the next combination", "attempt", vm.Attempt, "as", c.String(), "code", code)
		switch f {
		case nextType:
			skipType[fmt.Sprint(c.spot, "/", c.itype)] = true
		case nextMarket:
			skipMarket[c.spot] = true
		}
	}
	return fmt.Errorf("ec2 create %s: %w: %s", vm.Attempt, ErrNoCapacity, strings.Join(misses, "; "))
}

// run makes one RunInstances call and returns the launched instance ids.
func (b *Backend) run(ctx context.Context, vm backend.VM, c combination, userData []byte) ([]string, error) {
	o := b.opts
	in := &sdk.RunInstancesInput{
		MinCount:                          aws.Int32(1),
		MaxCount:                          aws.Int32(1),
		ClientToken:                       aws.String(ClientToken(vm.Attempt, o.Fleet, c.spot, c.itype, c.subnet)),
		UserData:                          aws.String(base64.StdEncoding.EncodeToString(userData)),
		InstanceInitiatedShutdownBehavior: types.ShutdownBehaviorTerminate,
		TagSpecifications: []types.TagSpecification{
			{ResourceType: types.ResourceTypeInstance, Tags: b.tags(vm)},
			{ResourceType: types.ResourceTypeVolume, Tags: b.tags(vm)},
		},
	}
	if o.LaunchTemplateID != "" || o.LaunchTemplateName != "" {
		lt := &types.LaunchTemplateSpecification{Version: aws.String(o.LaunchTemplateVersion)}
		if o.LaunchTemplateVersion == "" {
			lt.Version = aws.String("$Default")
		}
		if o.LaunchTemplateID != "" {
			lt.LaunchTemplateId = aws.String(o.LaunchTemplateID)
		} else {
			lt.LaunchTemplateName = aws.String(o.LaunchTemplateName)
		}
		in.LaunchTemplate = lt
	}
	if o.AMI != "" {
		in.ImageId = aws.String(o.AMI)
	}
	if vm.Warm {
		// Its first boot ends in a power-off that must keep it (warm.go).
		in.InstanceInitiatedShutdownBehavior = types.ShutdownBehaviorStop
	}
	if vm.Shape != nil && vm.Shape.Image != "" {
		in.ImageId = aws.String(vm.Shape.Image) // the shape's AMI
	}
	if c.itype != "" {
		in.InstanceType = types.InstanceType(c.itype)
	}
	if c.subnet != "" {
		in.SubnetId = aws.String(c.subnet)
	}
	if len(o.SecurityGroups) > 0 {
		in.SecurityGroupIds = o.SecurityGroups
	}
	if c.spot {
		spot := &types.SpotMarketOptions{
			SpotInstanceType:             types.SpotInstanceTypeOneTime,
			InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate,
		}
		if o.SpotMaxPrice != "" {
			spot.MaxPrice = aws.String(o.SpotMaxPrice)
		}
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot, SpotOptions: spot}
	}
	out, err := b.client.RunInstances(ctx, in)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, inst := range out.Instances {
		if inst.InstanceId != nil {
			ids = append(ids, *inst.InstanceId)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("RunInstances answered without an instance id")
	}
	return ids, nil
}

// tags are the attempt's tags, set on the instance and its volumes by the
// launch itself.
func (b *Backend) tags(vm backend.VM) []types.Tag {
	tags := []types.Tag{
		{Key: aws.String(TagAttempt), Value: aws.String(vm.Attempt)},
		{Key: aws.String(TagPool), Value: aws.String(vm.Pool)},
		{Key: aws.String(TagFleet), Value: aws.String(b.opts.Fleet)},
		{Key: aws.String("Name"), Value: aws.String(vm.Attempt)},
	}
	keys := make([]string, 0, len(b.opts.Tags))
	for k := range b.opts.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys) // a stable order keeps a retried launch's parameters identical
	for _, k := range keys {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(b.opts.Tags[k])})
	}
	return tags
}

// Stop implements backend.Backend: it terminates the attempt's instances
// (those Create launched, or, after a restart, those tagged with the
// attempt) and returns once EC2 has accepted the termination; an instance
// already shutting-down or terminated is stopped. InvalidInstanceID.NotFound
// means the instance is gone (law 7: a confirmed 404 for a thing being
// deleted), except within NotFoundGrace of its launch, when it more likely
// means EC2 has not caught up yet: then Stop fails and the agent tries again.
// A failed lookup stops nothing and is an error.
func (b *Backend) Stop(ctx context.Context, vm backend.VM) error {
	b.mu.Lock()
	l, known := b.launched[vm.Attempt]
	b.mu.Unlock()
	ids := l.ids
	if !known {
		var err error
		if ids, err = b.find(ctx, vm.Attempt); err != nil {
			return fmt.Errorf("ec2 stop %s: look up its instance: %w", vm.Attempt, blame(err))
		}
	}
	for _, id := range ids {
		_, err := b.client.TerminateInstances(ctx, &sdk.TerminateInstancesInput{InstanceIds: []string{id}})
		switch {
		case err == nil:
		case apiCode(err) == "InvalidInstanceID.NotFound":
			if known && b.opts.Now().Sub(l.at) < b.opts.NotFoundGrace {
				return fmt.Errorf("ec2 stop %s: %s launched %s ago is not visible yet (EC2 is eventually consistent); try again: %w",
					vm.Attempt, id, b.opts.Now().Sub(l.at).Round(time.Second), err)
			}
		default:
			return fmt.Errorf("ec2 stop %s: terminate %s: %w", vm.Attempt, id, blame(err))
		}
	}
	b.mu.Lock()
	delete(b.launched, vm.Attempt)
	b.mu.Unlock()
	return nil
}

// liveStates are the states of an instance that Stop would still have to
// terminate; shutting-down and terminated ones are already stopped.
var liveStates = []string{"pending", "running", "stopping", "stopped"}

// find returns the ids of this fleet's live instances tagged with attempt.
func (b *Backend) find(ctx context.Context, attempt string) ([]string, error) {
	var ids []string
	err := b.describe(ctx, []types.Filter{
		{Name: aws.String("tag:" + TagAttempt), Values: []string{attempt}},
	}, func(inst types.Instance) {
		if inst.InstanceId != nil {
			ids = append(ids, *inst.InstanceId)
		}
	})
	return ids, err
}

// List implements backend.Backend: the attempt ids (berth:attempt tag) of
// this fleet's instances that are pending, running, stopping or stopped,
// read with DescribeInstances page by page. An error is a failed read, on
// which the agent stops nothing.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	err := b.describe(ctx, nil, func(inst types.Instance) {
		for _, t := range inst.Tags {
			if aws.ToString(t.Key) == TagAttempt {
				if a := aws.ToString(t.Value); a != "" && !seen[a] {
					seen[a] = true
					out = append(out, a)
				}
			}
		}
	})
	if err != nil {
		return nil, fmt.Errorf("ec2 list: %w", err)
	}
	slices.Sort(out)
	return out, nil
}

// describe calls each for every live instance of this fleet that matches
// the extra filters, over every page.
func (b *Backend) describe(ctx context.Context, filters []types.Filter, each func(types.Instance)) error {
	in := &sdk.DescribeInstancesInput{
		Filters: append([]types.Filter{
			{Name: aws.String("tag:" + TagFleet), Values: []string{b.opts.Fleet}},
			{Name: aws.String("instance-state-name"), Values: liveStates},
		}, filters...),
		MaxResults: aws.Int32(b.opts.PageSize),
	}
	p := sdk.NewDescribeInstancesPaginator(b.client, in)
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, r := range page.Reservations {
			for _, inst := range r.Instances {
				each(inst)
			}
		}
	}
	return nil
}

// remember records what Create launched, and forgets launches older than
// forgetAfter (Stop finds those by tag).
func (b *Backend) remember(attempt string, ids []string) {
	now := b.opts.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for a, l := range b.launched {
		if now.Sub(l.at) > forgetAfter {
			delete(b.launched, a)
		}
	}
	b.launched[attempt] = launch{ids: ids, at: now}
}

// blame wraps an error EC2 answered with the culprit it is charged to
// (law 11, events/culprit.go): an image EC2 does not know or refuses is the
// image's fault (backend.ErrImage); any other answer of EC2's (capacity,
// limits, throttling past the retry budget, auth, 5xx) is the backend's
// (backend.ErrBackend). An error that is no answer of EC2's (the deadline,
// the network) is left alone: the agent charges it to the host.
func blame(err error) error {
	code := apiCode(err)
	switch {
	case code == "":
		return err
	case strings.HasPrefix(code, "InvalidAMIID."):
		return fmt.Errorf("%w: %w", backend.ErrImage, err)
	}
	return fmt.Errorf("%w: %w", backend.ErrBackend, err)
}

// apiCode is the EC2 error code of err ("" when err is not an API error).
func apiCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}
