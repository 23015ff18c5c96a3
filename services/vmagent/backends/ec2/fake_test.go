package ec2_test

import (
	"encoding/base64"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// fakeEC2 is an HTTP server that speaks the EC2 Query protocol (API version
// 2016-11-15) for RunInstances, TerminateInstances and DescribeInstances, as
// far as the backend uses them: form-encoded POSTs signed with SigV4, XML
// answers in the EC2 namespace, and errors as
// <Response><Errors><Error><Code>…</Code><Message>…</Message></Error></Errors><RequestID>…</RequestID></Response>
// with EC2's HTTP status for the code. It keeps EC2's idempotency rule: a
// RunInstances with a ClientToken seen before returns the first call's
// instance when the parameters are the same, and IdempotentParameterMismatch
// when they differ; a failed call records nothing under its token.
type fakeEC2 struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	instances []*fakeInstance
	tokens    map[string]fakeToken
	calls     map[string]int // action → calls
	runs      []url.Values   // every RunInstances form, in order
	seq       int            // instance and request ids
	subnetAZ  map[string]string

	// reject, when set, answers a RunInstances (that has not been
	// accepted under its token) with an error code, or "" to accept.
	reject func(f url.Values) string
	// throttle[action] answers that many calls with RequestLimitExceeded.
	throttle map[string]int
	// loseReply makes that many accepted RunInstances answer 500
	// InternalError after launching (the reply is lost; the launch is not).
	loseReply int
	// hang[action] makes calls of the action wait until the client gives up.
	hang map[string]bool
	// hidden: Describe and Terminate do not see instances launched so far
	// (EC2's eventual consistency right after a launch).
	hidden bool
	closed chan struct{}
}

type fakeInstance struct {
	id, image, itype, subnet, az, token, state, userData string
	spot                                                 bool
	tags                                                 map[string]string
	hidden                                               bool
}

type fakeToken struct {
	params string
	body   string
}

func newFakeEC2(t *testing.T) *fakeEC2 {
	f := &fakeEC2{t: t, tokens: map[string]fakeToken{}, calls: map[string]int{}, throttle: map[string]int{}, hang: map[string]bool{},
		subnetAZ: map[string]string{"subnet-a": "us-east-1a", "subnet-b": "us-east-1b", "subnet-c": "us-east-1c"},
		closed:   make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(func() {
		close(f.closed)
		f.srv.Close()
	})
	return f
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

func (f *fakeEC2) serve(w http.ResponseWriter, r *http.Request) {
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
	case !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 Credential=AKIDFAKE/") ||
		!strings.Contains(r.Header.Get("Authorization"), "/us-east-1/ec2/aws4_request"):
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
	default:
		f.t.Errorf("fake EC2: unexpected action %q", action)
		f.fail(w, "InvalidAction", "The action "+action+" is not valid for this web service.")
	}
}

func (f *fakeEC2) fail(w http.ResponseWriter, code, msg string) {
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

func (f *fakeEC2) ok(w http.ResponseWriter, action, inner string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
		`<%sResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>%s</requestId>%s</%sResponse>`,
		action, f.nextID("req"), inner, action)
}

func (f *fakeEC2) nextID(prefix string) string {
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

// tagSpecs reads TagSpecification.N.{ResourceType,Tag.M.Key,Tag.M.Value}.
func tagSpecs(form url.Values) map[string]map[string]string {
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

func (f *fakeEC2) runInstances(w http.ResponseWriter, form url.Values) {
	if form.Get("MinCount") != "1" || form.Get("MaxCount") != "1" {
		f.fail(w, "InvalidParameterValue", "this fake launches one instance per call")
		return
	}
	if form.Get("ImageId") == "" && form.Get("LaunchTemplate.LaunchTemplateId") == "" && form.Get("LaunchTemplate.LaunchTemplateName") == "" {
		f.fail(w, "MissingParameter", "The request must contain the parameter ImageId")
		return
	}
	token := form.Get("ClientToken")
	rest := url.Values{}
	for k, v := range form {
		if k != "ClientToken" {
			rest[k] = v
		}
	}
	params := rest.Encode()
	f.mu.Lock()
	f.runs = append(f.runs, form)
	prev, seen := f.tokens[token]
	f.mu.Unlock()
	if seen {
		if prev.params != params {
			f.fail(w, "IdempotentParameterMismatch", "The client token "+token+" was already used with different parameters.")
			return
		}
		f.ok(w, "RunInstances", prev.body)
		return
	}
	if f.reject != nil {
		if code := f.reject(form); code != "" {
			f.fail(w, code, "We currently do not have sufficient "+form.Get("InstanceType")+" capacity in the Availability Zone you requested.")
			return
		}
	}
	inst := &fakeInstance{
		id: f.nextID("i"), image: form.Get("ImageId"), itype: form.Get("InstanceType"), subnet: form.Get("SubnetId"),
		token: token, state: "pending", userData: form.Get("UserData"), spot: form.Get("InstanceMarketOptions.MarketType") == "spot",
		tags: tagSpecs(form)["instance"],
	}
	if inst.itype == "" {
		inst.itype = "t3.micro" // the template's
	}
	if inst.image == "" {
		inst.image = "ami-template"
	}
	inst.az = f.subnetAZ[inst.subnet]
	if inst.az == "" {
		inst.az = "us-east-1a"
	}
	body := fmt.Sprintf(`<reservationId>%s</reservationId><ownerId>123456789012</ownerId><groupSet/><instancesSet>%s</instancesSet>`,
		f.nextID("r"), instanceXML(inst))
	f.mu.Lock()
	f.instances = append(f.instances, inst)
	inst.hidden = f.hidden
	if token != "" {
		f.tokens[token] = fakeToken{params: params, body: body}
	}
	lose := f.loseReply > 0
	if lose {
		f.loseReply--
	}
	f.mu.Unlock()
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

func instanceXML(i *fakeInstance) string {
	var tags strings.Builder
	keys := make([]string, 0, len(i.tags))
	for k := range i.tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&tags, "<item><key>%s</key><value>%s</value></item>", esc(k), esc(i.tags[k]))
	}
	lifecycle := ""
	if i.spot {
		lifecycle = "<instanceLifecycle>spot</instanceLifecycle>"
	}
	return fmt.Sprintf(`<item><instanceId>%s</instanceId><imageId>%s</imageId>%s<instanceType>%s</instanceType>`+
		`<placement><availabilityZone>%s</availabilityZone><tenancy>default</tenancy></placement><subnetId>%s</subnetId>`+
		`<clientToken>%s</clientToken>%s<tagSet>%s</tagSet></item>`,
		i.id, i.image, stateXML("instanceState", i.state), esc(i.itype), i.az, esc(i.subnet), esc(i.token), lifecycle, tags.String())
}

func (f *fakeEC2) terminateInstances(w http.ResponseWriter, form url.Values) {
	ids := list(form, "InstanceId")
	f.mu.Lock()
	var items strings.Builder
	var missing []string
	found := map[string]*fakeInstance{}
	for _, id := range ids {
		i := f.byID(id)
		if i == nil || i.hidden {
			missing = append(missing, id)
			continue
		}
		found[id] = i
	}
	if len(missing) == 0 {
		for _, id := range ids {
			i := found[id]
			prev := i.state
			if i.state != "terminated" {
				i.state = "shutting-down"
			}
			fmt.Fprintf(&items, "<item><instanceId>%s</instanceId>%s%s</item>", id, stateXML("currentState", i.state), stateXML("previousState", prev))
		}
	}
	f.mu.Unlock()
	if len(missing) > 0 {
		f.fail(w, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", ")))
		return
	}
	f.ok(w, "TerminateInstances", "<instancesSet>"+items.String()+"</instancesSet>")
}

func (f *fakeEC2) byID(id string) *fakeInstance {
	for _, i := range f.instances {
		if i.id == id {
			return i
		}
	}
	return nil
}

func (f *fakeEC2) describeInstances(w http.ResponseWriter, form url.Values) {
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
	var match []*fakeInstance
	for _, i := range f.instances {
		if i.hidden {
			continue
		}
		// Time passes between calls: a launch is running, a termination done.
		switch i.state {
		case "pending":
			i.state = "running"
		case "shutting-down":
			i.state = "terminated"
		}
		ok := true
		for _, fl := range filters {
			var v string
			if fl.name == "instance-state-name" {
				v = i.state
			} else if tv, has := i.tags[strings.TrimPrefix(fl.name, "tag:")]; has {
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
			i.id, instanceXML(i))
	}
	f.mu.Unlock()
	next := ""
	if end < len(match) {
		next = fmt.Sprintf("<nextToken>page-%d</nextToken>", end)
	}
	f.ok(w, "DescribeInstances", "<reservationSet>"+sets.String()+"</reservationSet>"+next)
}

// seed adds an instance as if launched earlier (by anyone).
func (f *fakeEC2) seed(state string, tags map[string]string) string {
	id := f.nextID("i")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances = append(f.instances, &fakeInstance{id: id, image: "ami-1", itype: "m7i.large", az: "us-east-1a", state: state, tags: tags})
	return id
}

// vanish removes an instance, as EC2 does some time after it terminated.
func (f *fakeEC2) vanish(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.instances = slices.DeleteFunc(f.instances, func(i *fakeInstance) bool { return i.id == id })
}

// reveal makes hidden instances visible (EC2 caught up).
func (f *fakeEC2) reveal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hidden = false
	for _, i := range f.instances {
		i.hidden = false
	}
}

func (f *fakeEC2) count(action string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[action]
}

func (f *fakeEC2) all() []fakeInstance {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fakeInstance, len(f.instances))
	for n, i := range f.instances {
		out[n] = *i
	}
	return out
}

func (f *fakeEC2) runForms() []url.Values {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.runs)
}

func decodeUserData(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatalf("user data is not base64: %v", err)
	}
	return string(b)
}
