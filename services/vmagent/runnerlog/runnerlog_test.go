package runnerlog

import "testing"

// Runner outputs as actions/runner prints them (the refusals quoted in
// actions/runner issues #3651 and #4613, and GitHub's registration answer
// of 2026): the version, and whether GitHub refused it.
func TestReadFindsTheVersionAndGitHubsRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		want Status
	}{
		{"a runner that listens", "√ Connected to GitHub\n\nCurrent runner version: '2.337.0'\n2026-10-01 09:00:00Z: Listening for Jobs\n",
			Status{Version: "2.337.0"}},
		{"refused for its age", "Current runner version: '2.320.0'\n2025-01-13 04:31:47Z: Listening for Jobs\n" +
			"An error occured: Runner version v2.320.0 is deprecated and cannot receive messages.\n" +
			"Runner listener exit with terminated error, stop the service, no retry needed.\nExiting runner...\n",
			Status{Version: "2.320.0", Refused: true, Message: "An error occured: Runner version v2.320.0 is deprecated and cannot receive messages."}},
		{"refused, forbidden, no version line yet", "An error occurred: Error: Forbidden Runner version v2.336.0 is deprecated and cannot receive messages.\r\n",
			Status{Version: "2.336.0", Refused: true, Message: "An error occurred: Error: Forbidden Runner version v2.336.0 is deprecated and cannot receive messages."}},
		{"refused registration names the minimum", "Current runner version: '2.311.0'\nYour runner version is out of date and can no longer register with GitHub.\n" +
			"GitHub now requires runner version 2.329.0 or later for registration.\n",
			Status{Version: "2.311.0", Refused: true, Minimum: "2.329.0",
				Message: "Your runner version is out of date and can no longer register with GitHub. GitHub now requires runner version 2.329.0 or later for registration."}},
		{"nothing yet", "", Status{}},
	} {
		if got := Read([]byte(tc.out)); got != tc.want {
			t.Errorf("%s: Read = %+v; want %+v", tc.name, got, tc.want)
		}
	}
}
