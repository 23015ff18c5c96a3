package run

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/berth-ci/berth/events"
	"github.com/berth-ci/berth/services/config"
	"github.com/berth-ci/berth/services/testkit"
)

// Given a second dispatcher on a machine whose page address is taken,
// when it starts its page, then it goes on without one, logging what to
// change, instead of failing the dispatcher; on a free address the page
// answers from the fold; "off" serves none.
func TestAPageAddressTakenCostsThePageNotTheDispatcher(t *testing.T) {
	f := testkit.History().HostOnline("host-a", 4, 4).Fleet()
	read := func(ctx context.Context, fn func(*events.Fleet)) error { fn(f); return nil }
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	logger, logs := testkit.Logs(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := NewSystem()
	defer func() {
		cancel()
		if err := s.Wait(); err != nil {
			t.Error(err)
		}
	}()
	cfg := &config.Config{Dispatcher: config.Dispatcher{Page: config.Page{Listen: taken.Addr().String()}}}
	if err := servePage(ctx, s, cfg, read, nil, nil, logger); err != nil || s.PageAddr != "" {
		t.Fatalf("taken address: %v, page at %q; want no error and no page", err, s.PageAddr)
	}
	if !strings.Contains(logs.String(), "dispatcher.page.listen") {
		t.Errorf("no word of what to change:\n%s", logs)
	}
	cfg.Dispatcher.Page.Listen = config.PageOff
	if err := servePage(ctx, s, cfg, read, nil, nil, logger); err != nil || s.PageAddr != "" {
		t.Fatalf("off: %v, page at %q", err, s.PageAddr)
	}
	cfg.Dispatcher.Page.Listen = "127.0.0.1:0"
	if err := servePage(ctx, s, cfg, read, nil, nil, logger); err != nil || s.PageAddr == "" {
		t.Fatalf("free address: %v, page at %q", err, s.PageAddr)
	}
	resp, err := http.Get("http://" + s.PageAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `data-host="host-a"`) {
		t.Errorf("GET / = %d:\n%s", resp.StatusCode, b)
	}
}

// Given the page's listeners, when their address is printed, then a
// wildcard becomes this machine's name (a browser cannot open 0.0.0.0 or
// [::]) and is reported as reachable beyond loopback; loopback stays as is.
func TestThePagePrintsAnAddressABrowserOpens(t *testing.T) {
	name, err := os.Hostname()
	if err != nil {
		t.Skip("no host name:", err)
	}
	for in, want := range map[string]struct {
		addr string
		wide bool
	}{
		"127.0.0.1:8090": {"127.0.0.1:8090", false},
		"[::1]:8090":     {"[::1]:8090", false},
		"0.0.0.0:8090":   {net.JoinHostPort(name, "8090"), true},
		"[::]:8090":      {net.JoinHostPort(name, "8090"), true},
		"10.1.2.3:8090":  {"10.1.2.3:8090", true},
	} {
		if addr, wide := browsable(in); addr != want.addr || wide != want.wide {
			t.Errorf("browsable(%s) = %s, %v; want %s, %v", in, addr, wide, want.addr, want.wide)
		}
	}
}
