package model

import "github.com/computeql/computeql/instance"

// What the audit log records of a mutation: the input names what was acted on, the payload
// carries the refusals that are not top-level errors.

func (i UpdateInstanceInput) AuditTarget() string       { return i.ID }
func (i DeleteInstanceInput) AuditTarget() string       { return i.ID }
func (i StartInstanceInput) AuditTarget() string        { return i.ID }
func (i StopInstanceInput) AuditTarget() string         { return i.ID }
func (i RebootInstanceInput) AuditTarget() string       { return i.ID }
func (i CreateConsoleSessionInput) AuditTarget() string { return i.ID }
func (i SnapshotInstanceInput) AuditTarget() string     { return i.ID }
func (i ResizeInstanceInput) AuditTarget() string       { return i.ID }
func (i SetQuotaInput) AuditTarget() string             { return i.OrganizationID }
func (i DeleteImageInput) AuditTarget() string          { return i.ID }

func (p *CreateInstancePayload) Problems() []instance.FieldError       { return p.UserErrors }
func (p *UpdateInstancePayload) Problems() []instance.FieldError       { return p.UserErrors }
func (p *DeleteInstancePayload) Problems() []instance.FieldError       { return p.UserErrors }
func (p *InstancePowerPayload) Problems() []instance.FieldError        { return p.UserErrors }
func (p *CreateConsoleSessionPayload) Problems() []instance.FieldError { return p.UserErrors }
func (p *SnapshotInstancePayload) Problems() []instance.FieldError     { return p.UserErrors }
func (p *ResizeInstancePayload) Problems() []instance.FieldError       { return p.UserErrors }
func (p *SetQuotaPayload) Problems() []instance.FieldError             { return p.UserErrors }
func (p *DeleteImagePayload) Problems() []instance.FieldError          { return p.UserErrors }
