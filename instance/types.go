// Package instance owns the business rules of compute instances: what a valid instance is,
// who may do what to it, how it is charged against quota, and how a request becomes a stored
// desired state. It knows nothing of Redis, GraphQL or HTTP: storage, the work queue and the
// catalogue are interfaces it is given.
package instance

import (
	"time"

	"github.com/computeql/computeql/quota"
)

// ProvisioningStatus says where an instance is in its lifecycle.
type ProvisioningStatus string

// Provisioning statuses.
const (
	ProvisioningPending        ProvisioningStatus = "PENDING"
	ProvisioningProvisioning   ProvisioningStatus = "PROVISIONING"
	ProvisioningProvisioned    ProvisioningStatus = "PROVISIONED"
	ProvisioningDeprovisioning ProvisioningStatus = "DEPROVISIONING"
	ProvisioningError          ProvisioningStatus = "ERROR"
)

// Valid reports whether s is one of the provisioning statuses.
func (s ProvisioningStatus) Valid() bool {
	switch s {
	case ProvisioningPending, ProvisioningProvisioning, ProvisioningProvisioned, ProvisioningDeprovisioning, ProvisioningError:
		return true
	}
	return false
}

// HealthStatus is the health the region reports for the backing server.
type HealthStatus string

// Health statuses.
const (
	HealthUnknown  HealthStatus = "UNKNOWN"
	HealthHealthy  HealthStatus = "HEALTHY"
	HealthDegraded HealthStatus = "DEGRADED"
	HealthError    HealthStatus = "ERROR"
)

// PowerState is the backing server's power state as the region reports it.
type PowerState string

// Power states.
const (
	PowerPending  PowerState = "PENDING"
	PowerQueued   PowerState = "QUEUED"
	PowerBuilding PowerState = "BUILDING"
	PowerRunning  PowerState = "RUNNING"
	PowerStopping PowerState = "STOPPING"
	PowerStopped  PowerState = "STOPPED"
	PowerError    PowerState = "ERROR"
)

// Valid reports whether s is one of the power states.
func (s PowerState) Valid() bool {
	switch s {
	case PowerPending, PowerQueued, PowerBuilding, PowerRunning, PowerStopping, PowerStopped, PowerError:
		return true
	}
	return false
}

// PowerIntent is the power state a user asked for with the start and stop verbs.
type PowerIntent string

// ExpiryAction is what the end of an instance's lease does.
type ExpiryAction string

// The expiry actions.
const (
	ExpireStop   ExpiryAction = "STOP"
	ExpireDelete ExpiryAction = "DELETE"
)

// Power intents. A spec stored before intents existed has none, which means running.
const (
	IntentRunning PowerIntent = "RUNNING"
	IntentStopped PowerIntent = "STOPPED"
)

// ConditionStatus is whether a condition holds.
type ConditionStatus string

// Condition statuses.
const (
	ConditionTrue    ConditionStatus = "TRUE"
	ConditionFalse   ConditionStatus = "FALSE"
	ConditionUnknown ConditionStatus = "UNKNOWN"
)

// ConditionAvailable is the condition type that summarises whether the instance is usable.
const ConditionAvailable = "Available"

// Condition reasons.
const (
	ReasonProvisioning   = "Provisioning"
	ReasonProvisioned    = "Provisioned"
	ReasonErrored        = "Errored"
	ReasonDeprovisioning = "Deprovisioning"
	ReasonRebuilding     = "Rebuilding"
	// ReasonResizing: the server is being stopped, given its new flavor, or started again.
	ReasonResizing           = "Resizing"
	ReasonDependencyNotReady = "DependencyNotReady"
	// ReasonNoCapacity: the region has no room for the server now; it is tried again.
	ReasonNoCapacity = "NoCapacity"
	// ReasonRegionUnreachable: the region's host cannot be reached; the status shows what was
	// last known, and reconciling resumes when the host is back.
	ReasonRegionUnreachable = "RegionUnreachable"
)

// Tag is a user-defined name/value pair on an instance.
type Tag struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Networking is how the instance is reachable.
type Networking struct {
	SecurityGroupIDs []string `json:"securityGroupIds,omitempty"`
	PublicIP         bool     `json:"publicIP,omitempty"`
	// AllowedSourceAddresses are CIDRs in canonical (masked) form.
	AllowedSourceAddresses []string `json:"allowedSourceAddresses,omitempty"`
}

// Condition is one observed aspect of an instance with a reason and a message safe for users.
type Condition struct {
	Type               string          `json:"type"`
	Status             ConditionStatus `json:"status"`
	Reason             string          `json:"reason"`
	Message            string          `json:"message"`
	LastTransitionTime time.Time       `json:"lastTransitionTime"`
}

// Spec is the desired state of an instance: what the user asked for. Only the API writes it.
type Spec struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	Tags        []Tag  `json:"tags,omitempty"`
	// RegionID is the region of the network, fixed at create.
	RegionID                  string     `json:"region"`
	NetworkID                 string     `json:"networkId"`
	FlavorID                  string     `json:"flavorId"`
	ImageID                   string     `json:"imageId"`
	SSHCertificateAuthorityID string     `json:"sshCertificateAuthorityId,omitempty"`
	Networking                Networking `json:"networking"`
	// UserData is decoded cloud-init user data.
	UserData []byte `json:"userData,omitempty"`
	// SSHPublicKeys are authorized_keys lines the server's guest accepts, given at its build.
	SSHPublicKeys []string `json:"sshPublicKeys,omitempty"`
	// RebuildGeneration is the latest generation whose change the user allowed to rebuild the
	// server; workers rebuild only for a destructive difference at or before it.
	RebuildGeneration int64 `json:"rebuildGeneration,omitempty"`
	// ResizeGeneration is the generation of the latest resize: the server takes FlavorID in
	// place, keeping its disk, unless a later allowed rebuild replaces it anyway.
	ResizeGeneration int64 `json:"resizeGeneration,omitempty"`
	// ResizeRestart says the server was powered on when the resize was asked: workers stop
	// it to resize it and start it again after, with the user's consent (allowRestart).
	ResizeRestart bool `json:"resizeRestart,omitempty"`
	// DeletionProtection refuses deleteInstance while set.
	DeletionProtection bool `json:"deletionProtection,omitempty"`
	// ExpiresAt is the end of the instance's lease, nil for none: then the workers carry out
	// ExpiryAction (STOP when empty) and clear the lease.
	ExpiresAt    *time.Time   `json:"expiresAt,omitempty"`
	ExpiryAction ExpiryAction `json:"expiryAction,omitempty"`
	// Power is the power state the user asked for; "" is running. It outlives the server:
	// workers stop a server that finished building for an instance meant to be stopped.
	Power PowerIntent `json:"power,omitempty"`
	// Charge is what the instance holds of its organization's quota; it is released after the
	// backing server is gone.
	Charge    quota.Amounts `json:"charge"`
	CreatedAt time.Time     `json:"createdAt"`
	CreatedBy string        `json:"createdBy"`
	UpdatedAt time.Time     `json:"updatedAt"`
	UpdatedBy string        `json:"updatedBy"`
	// DeletedAt is set once deletion was requested.
	DeletedAt *time.Time `json:"deletedAt,omitempty"`
}

// Status is the observed state of an instance, projected from its backing server. Workers
// write it; the API writes it only to show a user's request at once (e.g. deprovisioning).
type Status struct {
	ProvisioningStatus ProvisioningStatus `json:"provisioningStatus"`
	HealthStatus       HealthStatus       `json:"healthStatus"`
	PowerState         PowerState         `json:"powerState"`
	PrivateIP          string             `json:"privateIP,omitempty"`
	PublicIP           string             `json:"publicIP,omitempty"`
	MACAddress         string             `json:"macAddress,omitempty"`
	Conditions         []Condition        `json:"conditions,omitempty"`
	// ObservedGeneration is the generation the last successful reconcile realised.
	ObservedGeneration int64 `json:"observedGeneration"`
}

// Building reports whether the instance's server is not built yet: pending or provisioning.
func (s Status) Building() bool {
	return s.ProvisioningStatus == ProvisioningPending || s.ProvisioningStatus == ProvisioningProvisioning
}

// Instance is a virtual machine as users see it.
type Instance struct {
	ID             string
	OrganizationID string
	ProjectID      string
	// Generation increases on every change of the spec.
	Generation int64
	// StatusVersion increases on every write of the status; status writes compare and set it.
	StatusVersion int64
	Spec
	Status Status
	// large is set on an instance read from the event log, which has no copy of its large
	// fields (see LargeFields).
	large *lazyLarge
}

// DesiredPower is the power state the user asked for.
func (i *Instance) DesiredPower() PowerIntent {
	if i.Power == "" {
		return IntentRunning
	}
	return i.Power
}

// Deleting reports whether deletion was requested.
func (i *Instance) Deleting() bool { return i.DeletedAt != nil }

// Key is the instance's work-queue key. The queue treats it as opaque; it carries the
// organization because every stored key of an instance lives under its organization.
func (i *Instance) Key() string { return Key(i.OrganizationID, i.ID) }

// Key returns the work-queue key of an instance.
func Key(org, id string) string { return org + "/" + id }

// setCondition replaces the condition of the same type, keeping its transition time when the
// status did not change.
func (s *Status) setCondition(c Condition) {
	c.Message = BoundMessage(c.Message)
	for i, old := range s.Conditions {
		if old.Type == c.Type {
			if old.Status == c.Status {
				c.LastTransitionTime = old.LastTransitionTime
			}
			s.Conditions[i] = c
			return
		}
	}
	s.Conditions = append(s.Conditions, c)
}
