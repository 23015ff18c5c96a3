//go:build darwin && arm64 && cgo

package vz

/*
#cgo darwin CFLAGS: -mmacosx-version-min=12 -x objective-c -fno-objc-arc
#cgo darwin LDFLAGS: -lobjc -framework Foundation -framework Virtualization
#import <Virtualization/Virtualization.h>

// berthDetachNetwork sets every network device's attachment of vm to nil
// on the VM's own queue (VZVirtualMachine is used on its queue only) and
// returns how many devices it detached.
static int berthDetachNetwork(void *vm, void *queue) {
	__block int n = 0;
	dispatch_sync((dispatch_queue_t)queue, ^{
		for (VZNetworkDevice *d in [(VZVirtualMachine *)vm networkDevices]) {
			[d setAttachment:nil];
			n++;
		}
	});
	return n;
}
*/
import "C"

import (
	"errors"
	"reflect"
	"unsafe"

	vzfw "github.com/Code-Hex/vz/v3"
)

// detachNetwork disconnects vm's network devices (VZNetworkDevice's
// attachment, macOS 12+). github.com/Code-Hex/vz/v3 v3.7.1 has no call
// for it, so this reads the VM's Objective-C object and dispatch queue
// from the module's unexported fields: pinned to v3.7.1 in go.mod, and
// checked by make vz-test (TestRealGuestCreateAndStop stops a real guest
// through it). A field it cannot find is an error, never a guess.
func detachNetwork(vm *vzfw.VirtualMachine) (int, error) {
	v := reflect.ValueOf(vm).Elem()
	pf, qf := v.FieldByName("pointer"), v.FieldByName("dispatchQueue")
	if !pf.IsValid() || pf.Kind() != reflect.Pointer || !qf.IsValid() || qf.Kind() != reflect.UnsafePointer {
		return 0, errors.New("vz: this github.com/Code-Hex/vz/v3 has no VM pointer or queue where v3.7.1 has them; update detachNetwork")
	}
	obj := *(*unsafe.Pointer)(unsafe.Pointer(pf.UnsafeAddr())) // *objc.Pointer
	queue := *(*unsafe.Pointer)(unsafe.Pointer(qf.UnsafeAddr()))
	if obj == nil || queue == nil {
		return 0, errors.New("vz: the VM has no Objective-C object or queue yet")
	}
	raw := *(*unsafe.Pointer)(obj) // objc.Pointer's one field: the object
	return int(C.berthDetachNetwork(raw, queue)), nil
}
