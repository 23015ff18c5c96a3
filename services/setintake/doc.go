// Package setintake is the runner scale set intake: beside the webhook
// intake (dispatch.Intake), it serves configured pools through GitHub's
// runner scale set API with the real client, github.com/actions/scaleset.
//
// Each pool is one scale set, named after the pool and labelled with its
// runner labels, created or updated at start. The intake holds the set's
// one message session and turns the queue's JobAssigned, JobStarted and
// JobCompleted messages into the same job facts the webhook intake stores
// (JobQueued, JobInProgress, JobCompleted), so placement, release, warm
// pools and the watchdog do not change. What makes it different from the
// library's own listener:
//
//   - at least once, durably: a message's facts are stored (the appender's
//     ack) and the cursor saved before the message is deleted; the session
//     id and the last message id live in the KV bucket berth_scalesets, so
//     a restart resumes, and a message seen twice stores nothing new (the
//     facts' ids are the job's: job-<id>-queued, …);
//   - one holder: a lease per set in that bucket, renewed with a revision
//     check; another replica takes the set over when the record's
//     revision has not moved for the lease's length on its own clock, and
//     deletes the session a dead holder left (409) before opening its own;
//   - honest capacity: every poll sends X-ScaleSetMaxCapacity from the
//     dispatcher's fold (Capacity);
//   - a reconciler: when the statistics' TotalAssignedJobs exceed the jobs
//     the fold knows for two polls in a row, the REST API's queued jobs
//     fill the gap (law 7: only a positive read adds a fact).
//
// A scale-set job's id in the catalogue is the message's runnerRequestId.
package setintake
