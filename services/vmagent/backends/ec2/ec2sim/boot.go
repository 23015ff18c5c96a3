package ec2sim

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// RunUserData returns a Boot that "boots" an instance the way cloud-init
// runs a shell-script user data: it decodes the instance's user data into
// dir/<instance id>/user-data and runs it with sh, in a process group of
// its own, with env plus INSTANCE_ID and INSTANCE_DIR (the script's
// directory); its output goes to INSTANCE_DIR/console.log. When the script
// exits the instance powers off (and is terminated, as the backend launches
// with InstanceInitiatedShutdownBehavior=terminate); when the instance is
// terminated first, its process group is killed.
func (f *Server) RunUserData(dir string, env []string) Boot {
	return func(inst Instance) func() {
		idir := filepath.Join(dir, inst.ID)
		script, err := inst.Script()
		if err == nil {
			err = os.MkdirAll(idir, 0o700)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(idir, "user-data"), []byte(script), 0o700)
		}
		var console *os.File
		if err == nil {
			console, err = os.Create(filepath.Join(idir, "console.log"))
		}
		if err != nil {
			f.t.Errorf("ec2sim: boot %s: %v", inst.ID, err)
			return func() {}
		}
		defer console.Close()
		cmd := exec.Command("sh", filepath.Join(idir, "user-data"))
		cmd.Dir = idir
		cmd.Env = append(append(os.Environ(), env...), "INSTANCE_ID="+inst.ID, "INSTANCE_DIR="+idir)
		cmd.Stdout, cmd.Stderr = console, console
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			f.t.Errorf("ec2sim: boot %s: %v", inst.ID, err)
			return func() {}
		}
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			_ = cmd.Wait()
			f.PowerOff(inst.ID)
		}()
		return func() {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	}
}
