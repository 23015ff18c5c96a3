// Package ec2sim is a fake EC2 endpoint for tests: an HTTP server that the
// real aws-sdk-go-v2 client talks to (EC2's query protocol: form-encoded
// POSTs signed with SigV4, XML answers), for the calls the ec2 backend makes.
// It boots an instance by handing it to Boot (a test runs its user data),
// and can refuse launches for capacity, throttle, hang, lose replies and lag
// like EC2's eventual consistency.
package ec2sim

import (
	"encoding/base64"
	"fmt"
	"html"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Server is an HTTP server that speaks the EC2 Query protocol (API version
// 2016-11-15) for RunInstances, TerminateInstances and DescribeInstances, as
// far as the backend uses them: form-encoded POSTs signed with SigV4 (access
// key AccessKey, region Region), XML answers in the EC2 namespace, and
// errors as
// <Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors><RequestID>…</RequestID></Response>
// with EC2's HTTP status for the code. It keeps EC2's idempotency rule: a
// RunInstances with a ClientToken seen before returns the first call's
// instance when the parameters are the same, and IdempotentParameterMismatch
// when they differ; a failed call records nothing under its token.
//
// Instances are pending when launched, running from the next
// DescribeInstances on, shutting-down when terminated and terminated from
// the next DescribeInstances on.
type Server struct {
	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	instances []*instance
	tokens    map[string]token
	calls     map[string]int // action → calls
	runs      []url.Values   // every RunInstances form, in order
	seq       int            // instance and request ids
	subnetAZ  map[string]string

	reject    func(f url.Values) string
	throttle  map[string]int
	loseReply int
	hang      map[string]bool
	hidden    bool
	boot      Boot
	closed    chan struct{}
}

// Boot starts an instance the server launched (it gets a copy) and returns
// the function that halts it, called when the instance is terminated. A
// booted instance that shuts itself down calls Server.PowerOff.
type Boot func(Instance) (halt func())

// Instance is a snapshot of one instance.
type Instance struct {
	ID, Image, Type, Subnet, AZ, Token, State string
	// UserData is as RunInstances received it (base64).
	UserData string
	Spot     bool
	Tags     map[string]string
}

type instance struct {
	Instance
	hidden bool
	halt   func()
	// stopOnShutdown: launched with InstanceInitiatedShutdownBehavior=stop,
	// so a power-off stops it rather than terminating it.
	stopOnShutdown bool
}

type token struct {
	params string
	body   string
}

// Access key and region the server accepts signatures for.
const (
	AccessKey = "AKIDFAKE"
	SecretKey = "secret"
	Region    = "us-east-1"
)

// New starts a server on loopback, closed when the test ends (after
// halting every booted instance).
func New(t testing.TB) *Server {
	f := &Server{t: t, tokens: map[string]token{}, calls: map[string]int{}, throttle: map[string]int{}, hang: map[string]bool{},
		subnetAZ: map[string]string{"subnet-a": "us-east-1a", "subnet-b": "us-east-1b", "subnet-c": "us-east-1c"},
		closed:   make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		close(f.closed)
		f.srv.Close()
		f.mu.Lock()
		var halts []func()
		for _, i := range f.instances {
			if i.halt != nil {
				halts = append(halts, i.halt)
				i.halt = nil
			}
		}
		f.mu.Unlock()
		for _, h := range halts {
			h()
		}
	})
	return f
}

// URL is the endpoint to give the SDK (BaseEndpoint).
func (f *Server) URL() string { return f.srv.URL }

// Reject, when set, answers a RunInstances (not already accepted under its
// token) with the error code it returns, or accepts it when that is "".
func (f *Server) Reject(r func(form url.Values) string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reject = r
}

// Throttle answers the next n calls of action with RequestLimitExceeded.
func (f *Server) Throttle(action string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttle[action] = n
}

// LoseReplies makes the next n accepted RunInstances answer 500
// InternalError after launching (the reply is lost; the launch is not).
func (f *Server) LoseReplies(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseReply = n
}

// Hang makes calls of action wait until the client gives up.
func (f *Server) Hang(action string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hang[action] = true
}

// Hide makes Describe and Terminate blind to instances launched from now
// until Reveal (EC2's eventual consistency right after a launch).
func (f *Server) Hide() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hidden = true
}

// OnBoot sets the function that starts launched instances.
func (f *Server) OnBoot(b Boot) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boot = b
}

// SetState forces an instance's state (e.g. terminated behind the
// backend's back).
func (f *Server) SetState(id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i := f.byID(id); i != nil {
		i.State = state
	}
}

// PowerOff is a booted instance shutting itself down: it stops (stopping,
// then stopped) when launched with InstanceInitiatedShutdownBehavior=stop,
// else it is terminated (shutting-down, then terminated).
func (f *Server) PowerOff(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := f.byID(id)
	switch {
	case i == nil || i.State == "terminated" || i.State == "shutting-down":
	case i.stopOnShutdown:
		i.State, i.halt = "stopping", nil
	default:
		i.State, i.halt = "shutting-down", nil
	}
}

// statusOf is the HTTP status EC2 answers an error code with: capacity and
// internal errors are server errors (500), throttling is 503, the rest are
// client errors (400).
func statusOf(code string) int {
	switch code {
	case "InsufficientInstanceCapacity", "InsufficientCapacity", "InternalError":
		return http.StatusInternalServerError
	case "RequestLimitExceeded", "Unavailable":
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

func (f *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	form, err := url.ParseQuery(string(body))
	action := form.Get("Action")
	switch {
	case r.Method != http.MethodPost || err != nil || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded"):
		f.fail(w, "InvalidParameterValue", "expected a form-encoded POST")
		return
	case form.Get("Version") != "2016-11-15":
		f.fail(w, "InvalidParameterValue", "unsupported Version "+form.Get("Version"))
		return
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential="+AccessKey+"/") ||
		!strings.Contains(r.Header.Get("Authorization"), "/"+Region+"/ec2/aws4_request"):
		f.fail(w, "AuthFailure", "AWS was not able to validate the provided access credentials")
		return
	}
	f.mu.Lock()
	f.calls[action]++
	hang := f.hang[action]
	throttled := f.throttle[action] > 0
	if throttled {
		f.throttle[action]--
	}
	f.mu.Unlock()
	if hang {
		select {
		case <-r.Context().Done():
		case <-f.closed:
		}
		return
	}
	if throttled {
		f.fail(w, "RequestLimitExceeded", "Request limit exceeded.")
		return
	}
	switch action {
	case "RunInstances":
		f.runInstances(w, form)
	case "TerminateInstances":
		f.terminateInstances(w, form)
	case "DescribeInstances":
		f.describeInstances(w, form)
	case "ModifyInstanceAttribute":
		f.modifyInstanceAttribute(w, form)
	case "StartInstances":
		f.startInstances(w, form)
	default:
		f.t.Errorf("fake EC2: unexpected action %q", action)
		f.fail(w, "InvalidAction", "The action "+action+" is not valid for this web service.")
	}
}

func (f *Server) fail(w http.ResponseWriter, code, msg string) {
	f.mu.Lock()
	f.seq++
	id := fmt.Sprintf("req-%d", f.seq)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(statusOf(code))
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>%s</RequestID></Response>`,
		esc(code), esc(msg), id)
}

func (f *Server) ok(w http.ResponseWriter, action, inner string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<%sResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>%s</requestId>%s</%sResponse>`,
		action, f.nextID("req"), inner, action)
}

func (f *Server) nextID(prefix string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	return fmt.Sprintf("%s-%017x", prefix, f.seq)
}

func esc(s string) string { return html.EscapeString(s) }

// list reads an EC2 query list: prefix.1, prefix.2, …
func list(form url.Values, prefix string) []string {
	var out []string
	for i := 1; form.Has(prefix + "." + strconv.Itoa(i)); i++ {
		out = append(out, form.Get(prefix+"."+strconv.Itoa(i)))
	}
	return out
}

// TagSpecs reads TagSpecification.N.{ResourceType,Tag.M.Key,Tag.M.Value}.
func TagSpecs(form url.Values) map[string]map[string]string {
	out := map[string]map[string]string{}
	for i := 1; form.Has(fmt.Sprintf("TagSpecification.%d.ResourceType", i)); i++ {
		tags := map[string]string{}
		for j := 1; form.Has(fmt.Sprintf("TagSpecification.%d.Tag.%d.Key", i, j)); j++ {
			tags[form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Key", i, j))] = form.Get(fmt.Sprintf("TagSpecification.%d.Tag.%d.Value", i, j))
		}
		out[form.Get(fmt.Sprintf("TagSpecification.%d.ResourceType", i))] = tags
	}
	return out
}

func (f *Server) runInstances(w http.ResponseWriter, form url.Values) {
	if form.Get("MinCount") != "1" || form.Get("MaxCount") != "1" {
		f.fail(w, "InvalidParameterValue", "this fake launches one instance per call")
		return
	}
	if form.Get("ImageId") == "" && form.Get("LaunchTemplate.LaunchTemplateId") == "" && form.Get("LaunchTemplate.LaunchTemplateName") == "" {
		f.fail(w, "MissingParameter", "The request must contain the parameter ImageId")
		return
	}
	tok := form.Get("ClientToken")
	rest := url.Values{}
	for k, v := range form {
		if k != "ClientToken" {
			rest[k] = v
		}
	}
	params := rest.Encode()
	f.mu.Lock()
	f.runs = append(f.runs, form)
	prev, seen := f.tokens[tok]
	f.mu.Unlock()
	if seen {
		if prev.params != params {
			f.fail(w, "IdempotentParameterMismatch", "The client token "+tok+" was already used with different parameters.")
			return
		}
		f.ok(w, "RunInstances", prev.body)
		return
	}
	f.mu.Lock()
	reject := f.reject
	f.mu.Unlock()
	if reject != nil {
		if code := reject(form); code != "" {
			f.fail(w, code, "We currently do not have sufficient "+form.Get("InstanceType")+" capacity in the Availability Zone you requested.")
			return
		}
	}
	inst := &instance{Instance: Instance{
		ID: f.nextID("i"), Image: form.Get("ImageId"), Type: form.Get("InstanceType"), Subnet: form.Get("SubnetId"),
		Token: tok, State: "pending", UserData: form.Get("UserData"), Spot: form.Get("InstanceMarketOptions.MarketType") == "spot",
		Tags: TagSpecs(form)["instance"],
	}, stopOnShutdown: form.Get("InstanceInitiatedShutdownBehavior") == "stop"}
	if inst.Type == "" {
		inst.Type = "t3.micro" // the template's
	}
	if inst.Image == "" {
		inst.Image = "ami-template"
	}
	inst.AZ = f.subnetAZ[inst.Subnet]
	if inst.AZ == "" {
		inst.AZ = "us-east-1a"
	}
	body := fmt.Sprintf(`<reservationId>%s</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>%s</instancesSet>`,
		f.nextID("r"), instanceXML(inst))
	f.mu.Lock()
	f.instances = append(f.instances, inst)
	inst.hidden = f.hidden
	if tok != "" {
		f.tokens[tok] = token{params: params, body: body}
	}
	lose := f.loseReply > 0
	if lose {
		f.loseReply--
	}
	boot := f.boot
	f.mu.Unlock()
	f.bootOne(boot, inst)
	if lose {
		f.fail(w, "InternalError", "An internal error has occurred.")
		return
	}
	f.ok(w, "RunInstances", body)
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48, "stopping": 64, "stopped": 80}

func stateXML(elem, state string) string {
	return fmt.Sprintf("<%s><code>%d</code><name>%s</name></%s>", elem, stateCodes[state], state, elem)
}

func instanceXML(i *instance) string {
	var tags strings.Builder
	keys := make([]string, 0, len(i.Tags))
	for k := range i.Tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&tags, "<item><key>%s</key><value>%s</value></item>", esc(k), esc(i.Tags[k]))
	}
	lifecycle := ""
	if i.Spot {
		lifecycle = "<instanceLifecycle>spot</instanceLifecycle>"
	}
	return fmt.Sprintf(`<item><instanceId>%s</instanceId><imageId>%s</imageId>%s<instanceType>%s</instanceType>`+
		`<placement><availabilityZone>%s</availabilityZone><tenancy>default</tenancy></placement><subnetId>%s</subnetId>`+
		`<clientToken>%s</clientToken>%s<tagSet>%s</tagSet></item>`,
		i.ID, i.Image, stateXML("instanceState", i.State), esc(i.Type), i.AZ, esc(i.Subnet), esc(i.Token), lifecycle, tags.String())
}

func (f *Server) terminateInstances(w http.ResponseWriter, form url.Values) {
	ids := list(form, "InstanceId")
	f.mu.Lock()
	var items strings.Builder
	var missing []string
	found := map[string]*instance{}
	for _, id := range ids {
		i := f.byID(id)
		if i == nil || i.hidden {
			missing = append(missing, id)
			continue
		}
		found[id] = i
	}
	var halts []func()
	if len(missing) == 0 {
		for _, id := range ids {
			i := found[id]
			prev := i.State
			if i.State != "terminated" {
				i.State = "shutting-down"
			}
			if i.halt != nil {
				halts = append(halts, i.halt)
				i.halt = nil
			}
			fmt.Fprintf(&items, "<item><instanceId>%s</instanceId>%s%s</item>", id, stateXML("currentState", i.State), stateXML("previousState", prev))
		}
	}
	f.mu.Unlock()
	for _, h := range halts {
		h()
	}
	if len(missing) > 0 {
		f.fail(w, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", ")))
		return
	}
	f.ok(w, "TerminateInstances", "<instancesSet>"+items.String()+"</instancesSet>")
}

func (f *Server) byID(id string) *instance {
	for _, i := range f.instances {
		if i.ID == id {
			return i
		}
	}
	return nil
}

func (f *Server) describeInstances(w http.ResponseWriter, form url.Values) {
	type filter struct {
		name   string
		values []string
	}
	var filters []filter
	for n := 1; form.Has(fmt.Sprintf("Filter.%d.Name", n)); n++ {
		fl := filter{name: form.Get(fmt.Sprintf("Filter.%d.Name", n)), values: list(form, fmt.Sprintf("Filter.%d.Value", n))}
		if fl.name != "instance-state-name" && !strings.HasPrefix(fl.name, "tag:") {
			f.fail(w, "InvalidParameterValue", "The filter '"+fl.name+"' is invalid")
			return
		}
		filters = append(filters, fl)
	}
	pageSize := 1000
	if s := form.Get("MaxResults"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 5 || n > 1000 {
			f.fail(w, "InvalidParameterValue", "MaxResults must be between 5 and 1000")
			return
		}
		pageSize = n
	}
	start := 0
	if tok := form.Get("NextToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil {
			f.fail(w, "InvalidParameterValue", "bad NextToken")
			return
		}
		start = n
	}
	f.mu.Lock()
	var match []*instance
	for _, i := range f.instances {
		if i.hidden {
			continue
		}
		// Time passes between calls: a launch is running, a termination done.
		switch i.State {
		case "pending":
			i.State = "running"
		case "shutting-down":
			i.State = "terminated"
		case "stopping":
			i.State = "stopped"
		}
		ok := true
		for _, fl := range filters {
			var v string
			if fl.name == "instance-state-name" {
				v = i.State
			} else if tv, has := i.Tags[strings.TrimPrefix(fl.name, "tag:")]; has {
				v = tv
			} else {
				ok = false
				break
			}
			if !slices.Contains(fl.values, v) {
				ok = false
				break
			}
		}
		if ok {
			match = append(match, i)
		}
	}
	var sets strings.Builder
	end := min(start+pageSize, len(match))
	for _, i := range match[min(start, len(match)):end] {
		fmt.Fprintf(&sets, "<item><reservationId>r-%s</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>%s</instancesSet></item>",
			i.ID, instanceXML(i))
	}
	f.mu.Unlock()
	next := ""
	if end < len(match) {
		next = fmt.Sprintf("<nextToken>page-%d</nextToken>", end)
	}
	f.ok(w, "DescribeInstances", "<reservationSet>"+sets.String()+"</reservationSet>"+next)
}

// modifyInstanceAttribute sets an instance's user data (UserData.Value,
// base64), which EC2 allows only while the instance is stopped.
func (f *Server) modifyInstanceAttribute(w http.ResponseWriter, form url.Values) {
	id, ud := form.Get("InstanceId"), form.Get("UserData.Value")
	if !form.Has("UserData.Value") {
		f.fail(w, "InvalidParameterCombination", "this fake modifies user data only")
		return
	}
	f.mu.Lock()
	i := f.byID(id)
	var code, msg string
	switch {
	case i == nil || i.hidden:
		code, msg = "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist"
	case i.State != "stopped":
		code, msg = "IncorrectInstanceState", "The instance '"+id+"' is not in the 'stopped' state."
	default:
		i.UserData = ud
	}
	f.mu.Unlock()
	if code != "" {
		f.fail(w, code, msg)
		return
	}
	f.ok(w, "ModifyInstanceAttribute", "<return>true</return>")
}

// startInstances starts stopped instances; each boots again (Boot) with
// its user data as it is now.
func (f *Server) startInstances(w http.ResponseWriter, form url.Values) {
	ids := list(form, "InstanceId")
	f.mu.Lock()
	var items strings.Builder
	var started []*instance
	code, msg := "", ""
	for _, id := range ids {
		i := f.byID(id)
		switch {
		case i == nil || i.hidden:
			code, msg = "InvalidInstanceID.NotFound", "The instance ID '"+id+"' does not exist"
		case i.State != "stopped" && i.State != "pending" && i.State != "running":
			code, msg = "IncorrectInstanceState", "The instance '"+id+"' is not in a state from which it can be started."
		}
	}
	if code == "" {
		for _, id := range ids {
			i := f.byID(id)
			prev := i.State
			if prev == "stopped" {
				i.State = "pending"
				started = append(started, i)
			}
			fmt.Fprintf(&items, "<item><instanceId>%s</instanceId>%s%s</item>", id, stateXML("currentState", i.State), stateXML("previousState", prev))
		}
	}
	boot := f.boot
	f.mu.Unlock()
	if code != "" {
		f.fail(w, code, msg)
		return
	}
	for _, i := range started {
		f.bootOne(boot, i)
	}
	f.ok(w, "StartInstances", "<instancesSet>"+items.String()+"</instancesSet>")
}

// bootOne boots i with boot (if any) and keeps its halt.
func (f *Server) bootOne(boot Boot, i *instance) {
	if boot == nil {
		return
	}
	f.mu.Lock()
	snapshot := i.copy()
	f.mu.Unlock()
	halt := boot(snapshot)
	f.mu.Lock()
	if i.State == "pending" || i.State == "running" {
		i.halt = halt
		halt = nil
	}
	f.mu.Unlock()
	if halt != nil { // terminated while it booted
		halt()
	}
}

// Seed adds an instance as if launched earlier (by anyone) and returns its id.
func (f *Server) Seed(state string, tags map[string]string) string {
	id := f.nextID("i")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances = append(f.instances, &instance{Instance: Instance{ID: id, Image: "ami-1", Type: "m7i.large", AZ: "us-east-1a", State: state, Tags: tags}})
	return id
}

// Vanish removes an instance, as EC2 does some time after it terminated.
func (f *Server) Vanish(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances = slices.DeleteFunc(f.instances, func(i *instance) bool { return i.ID == id })
}

// Reveal makes hidden instances visible (EC2 caught up) and ends Hide.
func (f *Server) Reveal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hidden = false
	for _, i := range f.instances {
		i.hidden = false
	}
}

// Count is how many calls of action the server received (throttled ones
// included).
func (f *Server) Count(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

// Instances are snapshots of every instance, in launch order.
func (f *Server) Instances() []Instance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Instance, len(f.instances))
	for n, i := range f.instances {
		out[n] = i.copy()
	}
	return out
}

func (i *instance) copy() Instance {
	c := i.Instance
	c.Tags = maps.Clone(i.Tags)
	return c
}

// RunForms are the forms of every RunInstances call, in order.
func (f *Server) RunForms() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.runs)
}

// Script decodes an instance's user data (base64, as RunInstances takes it).
func (i Instance) Script() (string, error) {
	b, err := base64.StdEncoding.DecodeString(i.UserData)
	return string(b), err
}
