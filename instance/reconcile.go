package instance

import (
	"bytes"
	"slices"
	"time"

	"github.com/computeql/computeql/region"
)

// The rules of reconciling an instance against its backing server. Workers
// apply them; the decisions live here with the other rules.

// ServerSpec is the server that realises the instance's desired state, carrying the reserved
// tag that links it back.
func (i *Instance) ServerSpec() region.ServerSpec {
	return region.ServerSpec{
		Scope:                     i.Scope(),
		Name:                      i.Name,
		FlavorID:                  i.FlavorID,
		ImageID:                   i.ImageID,
		SSHCertificateAuthorityID: i.SSHCertificateAuthorityID,
		UserData:                  i.UserData,
		SSHPublicKeys:             i.SSHPublicKeys,
		Networking:                region.ServerNetworking(i.Networking),
		Tags:                      map[string]string{region.InstanceTag: i.ID},
	}
}

// Scope is where the instance's server is looked for.
func (i *Instance) Scope() region.Scope {
	return region.Scope{OrganizationID: i.OrganizationID, ProjectID: i.ProjectID, RegionID: i.RegionID, NetworkID: i.NetworkID}
}

// RebuildNeeded lists the fields in which the server differs from the instance in a way only
// a new server can realise: its disk, IPs and MAC are lost.
func (i *Instance) RebuildNeeded(s *region.Server) []string {
	var fields []string
	if s.FlavorID != i.FlavorID && !i.resizes() {
		fields = append(fields, "flavorId")
	}
	if s.ImageID != i.ImageID {
		fields = append(fields, "imageId")
	}
	if s.SSHCertificateAuthorityID != i.SSHCertificateAuthorityID {
		fields = append(fields, "sshCertificateAuthorityId")
	}
	if !bytes.Equal(s.UserData, i.UserData) {
		fields = append(fields, "userData")
	}
	if !slices.Equal(s.SSHPublicKeys, i.SSHPublicKeys) {
		fields = append(fields, "sshPublicKeys")
	}
	return fields
}

// resizes reports whether the instance's flavor is to be taken by its server in place: the
// latest change of the flavor was a resize, not an allowed rebuild.
func (i *Instance) resizes() bool { return i.ResizeGeneration > i.RebuildGeneration }

// ResizeNeeded reports whether the server is yet to take the instance's flavor by a resize.
func (i *Instance) ResizeNeeded(s *region.Server) bool {
	return i.resizes() && s.FlavorID != i.FlavorID
}

// Resizing reports whether a resize asked for has not been seen through yet: the server may
// still be stopped for it, resized, or about to be started again.
func (i *Instance) Resizing() bool {
	return i.resizes() && i.Status.ObservedGeneration < i.ResizeGeneration
}

// StartAfterResize reports whether workers must start the server a resize stopped: it took
// the new flavor, the user consented to the restart and still wants it running.
func (i *Instance) StartAfterResize(s *region.Server) bool {
	return i.Resizing() && i.ResizeRestart && s.FlavorID == i.FlavorID && s.State == region.ServerStopped &&
		i.DesiredPower() == IntentRunning
}

// NetworkingDiffers reports whether the server's networking, which changes in place, differs.
func (i *Instance) NetworkingDiffers(s *region.Server) bool {
	a, b := i.Networking, s.Networking
	return a.PublicIP != b.PublicIP || !slices.Equal(a.SecurityGroupIDs, b.SecurityGroupIDs) ||
		!slices.Equal(a.AllowedSourceAddresses, b.AllowedSourceAddresses)
}

var powerOf = map[region.ServerState]PowerState{
	region.ServerPending:  PowerQueued,
	region.ServerBuilding: PowerBuilding,
	region.ServerRunning:  PowerRunning,
	region.ServerStopping: PowerStopping,
	region.ServerStopped:  PowerStopped,
	// A power change under way: the server is neither up nor settled down.
	region.ServerStarting:  PowerPending,
	region.ServerRebooting: PowerPending,
	region.ServerDeleting:  PowerStopping,
	region.ServerError:     PowerError,
}

var healthOf = map[region.ServerHealth]HealthStatus{
	region.HealthUnknown:  HealthUnknown,
	region.HealthHealthy:  HealthHealthy,
	region.HealthDegraded: HealthDegraded,
	region.HealthError:    HealthError,
}

// Observe returns the status that projects the server onto the instance: power state, IPs,
// MAC and health come from the server, and the region is the truth for them. A server the
// region reports in error makes the instance ERROR with the region's message. The generation
// counts as realised once the server matches the spec and has settled.
func (i *Instance) Observe(s *region.Server, now time.Time) Status {
	st := i.Status
	st.Conditions = slices.Clone(i.Status.Conditions)
	st.PowerState = powerOf[s.State]
	st.HealthStatus = healthOf[s.Health]
	st.PrivateIP, st.PublicIP, st.MACAddress = s.PrivateIP, s.PublicIP, s.MAC
	switch {
	case s.State == region.ServerError:
		st.ProvisioningStatus = ProvisioningError
		msg := s.Message
		if msg == "" {
			msg = "The region reports the server in error."
		}
		st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: ReasonErrored, Message: msg, LastTransitionTime: now})
	case s.State.Provisioning() || s.State == region.ServerDeleting:
		st.ProvisioningStatus = ProvisioningProvisioning
		reason, msg := ReasonProvisioning, "The server is being built."
		if i.RebuildGeneration > i.Status.ObservedGeneration {
			// An allowed rebuild lasts until the new server runs.
			reason, msg = ReasonRebuilding, "The server is being rebuilt: its disk, IP addresses and MAC address are new."
		}
		st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: reason, Message: msg, LastTransitionTime: now})
	case i.ResizeNeeded(s):
		st.ProvisioningStatus = ProvisioningProvisioned
		msg := "The server is being resized to flavor " + i.FlavorID + ": its disk, IP addresses and MAC address are kept."
		if i.ResizeRestart {
			msg += " It is stopped for the resize and started again after it."
		}
		st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: ReasonResizing, Message: msg, LastTransitionTime: now})
	default:
		st.ProvisioningStatus = ProvisioningProvisioned
		st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionTrue, Reason: ReasonProvisioned, Message: "The server is " + string(s.State) + ".", LastTransitionTime: now})
		if len(i.RebuildNeeded(s)) == 0 && !i.NetworkingDiffers(s) {
			st.ObservedGeneration = i.Generation
		}
	}
	return st
}

// ResizeHeld returns the status of an instance whose resize cannot proceed now, with the
// reason and message saying why: the server is observed as it is.
func (i *Instance) ResizeHeld(s *region.Server, reason, message string, now time.Time) Status {
	st := i.Observe(s, now)
	st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: reason, Message: message, LastTransitionTime: now})
	return st
}

// StopWhenBuilt reports whether workers must stop the running server of an instance the user
// wants stopped. That is so when the server has just been built (the stored status still
// shows the instance provisioning: a new server, a rebuild or a recreate), or when the stop
// was asked for after the last reconcile (the generation is not yet observed), which covers a
// stop asked for while the build was completing. A server started later is left running:
// startInstance records its intent a moment after the region accepted the start, and a worker
// that looks in between must not undo it.
func (i *Instance) StopWhenBuilt(s *region.Server) bool {
	if i.DesiredPower() != IntentStopped || s.State != region.ServerRunning {
		return false
	}
	building := i.Status.Building()
	return building || i.Generation > i.Status.ObservedGeneration
}

// Awaiting returns the status while the instance waits for a server being created or
// rebuilt: provisioning, with the reason saying which.
func (i *Instance) Awaiting(reason, message string, now time.Time) Status {
	st := i.Status
	st.Conditions = slices.Clone(i.Status.Conditions)
	st.ProvisioningStatus = ProvisioningProvisioning
	st.PowerState = PowerPending
	st.PrivateIP, st.PublicIP, st.MACAddress = "", "", ""
	st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: reason, Message: message, LastTransitionTime: now})
	return st
}

// Failed returns the status after reconciling failed: an Errored condition with a message safe
// for users. The provisioning status becomes ERROR only when the failure is final.
func (i *Instance) Failed(message string, final bool, now time.Time) Status {
	st := i.Status
	st.Conditions = slices.Clone(i.Status.Conditions)
	if final {
		st.ProvisioningStatus = ProvisioningError
	}
	st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: ReasonErrored, Message: message, LastTransitionTime: now})
	return st
}

// Unreachable returns the status while the region's host cannot be reached: what was last
// known of the server stays (nothing is decided from the host's silence), its health is
// unknown, and the condition says why.
func (i *Instance) Unreachable(message string, now time.Time) Status {
	st := i.Status
	st.Conditions = slices.Clone(i.Status.Conditions)
	st.HealthStatus = HealthUnknown
	st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionUnknown, Reason: ReasonRegionUnreachable, Message: message, LastTransitionTime: now})
	return st
}

// MarkDeleting returns the instance with its deletion requested at now by who, the status
// that shows it deprovisioning with the message, and the fields that change. The store write
// of both is the deletion request; workers then tear the server down.
func (i *Instance) MarkDeleting(now time.Time, by, message string) (Instance, Status, []string) {
	next := *i
	next.DeletedAt, next.UpdatedAt, next.UpdatedBy = &now, now, by
	st := i.Status
	st.Conditions = slices.Clone(i.Status.Conditions)
	st.ProvisioningStatus = ProvisioningDeprovisioning
	st.setCondition(Condition{Type: ConditionAvailable, Status: ConditionFalse, Reason: ReasonDeprovisioning, Message: message, LastTransitionTime: now})
	return next, st, append(SpecChanges(i.Spec, next.Spec), StatusChanges(i.Status, st)...)
}
