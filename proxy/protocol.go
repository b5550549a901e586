package proxy

import "github.com/fenceproxy/fenceproxy/rewrite"

// Message type bytes of the PostgreSQL wire protocol (version 3) that the proxy names. The same byte means
// different messages in the two directions ('S' is Sync from the client, ParameterStatus from the server), so
// the names carry the direction.

// Frontend (client to server) messages.
const (
	msgQuery        byte = 'Q'
	msgParse        byte = 'P'
	msgBind         byte = 'B'
	msgExecute      byte = 'E'
	msgDescribe     byte = 'D'
	msgClose        byte = 'C'
	msgFlush        byte = 'H'
	msgSync         byte = 'S'
	msgFunctionCall byte = 'F'
	msgCopyData     byte = 'd'
	msgCopyDone     byte = 'c'
	msgCopyFail     byte = 'f'
	msgPassword     byte = 'p' // PasswordMessage, SASLInitialResponse, SASLResponse, GSSResponse
	msgTerminate    byte = 'X'
)

// frontendType reports whether typ is a message type PostgreSQL reads from a client after its login
// (PostgreSQL 15's SocketBackend); any other ends the session with 08P01 there. PasswordMessage is not one:
// it belongs to the login. The one list for the session core (onClientMsg) and the pool (relayPooled).
func frontendType(typ byte) bool {
	switch typ {
	case msgQuery, msgFunctionCall, msgTerminate, msgBind, msgClose, msgDescribe, msgExecute, msgFlush, msgParse, msgSync,
		msgCopyData, msgCopyDone, msgCopyFail:
		return true
	}
	return false
}

// Backend (server to client) messages.
const (
	msgAuthentication           byte = 'R'
	msgBackendKeyData           byte = 'K'
	msgParameterStatus          byte = 'S'
	msgReadyForQuery            byte = 'Z'
	msgErrorResponse            byte = 'E'
	msgNoticeResponse           byte = 'N'
	msgNotificationResponse     byte = 'A'
	msgCommandComplete          byte = 'C'
	msgDataRow                  byte = 'D'
	msgParseComplete            byte = '1'
	msgCloseComplete            byte = '3'
	msgBindComplete             byte = '2'
	msgParameterDescription     byte = 't'
	msgRowDescription           byte = 'T'
	msgNoData                   byte = 'n'
	msgEmptyQueryResponse       byte = 'I'
	msgPortalSuspended          byte = 's'
	msgNegotiateProtocolVersion byte = 'v'
	msgCopyInResponse           byte = 'G'
	msgCopyBothResponse         byte = 'W'
)

// ReadyForQuery transaction status bytes.
const (
	txIdle    byte = 'I' // not in a transaction block
	txBlock   byte = 'T' // in a transaction block
	txFailed  byte = 'E' // in a failed transaction block
	txUnknown byte = 0   // no ReadyForQuery seen yet
)

// Authentication request codes (the first word of an Authentication message's body).
const (
	authOK   = 0
	authSASL = 10
)

// ErrorResponse field codes.
const (
	fieldSeverity = 'V' // non-localized severity
	fieldCode     = 'C'
	fieldMessage  = 'M'
	fieldDetail   = 'D'
	fieldTable    = 't'
	fieldPosition = 'P'
)

// SQLSTATEs the proxy sends or looks for. The fencing codes are rewrite's (the contract's 55F0x); the others
// are PostgreSQL's own, used with the meaning PostgreSQL gives them. This is the one list: no SQLSTATE is
// spelled as a literal anywhere else in proxy/.
const (
	sqlstateStale       = rewrite.CodeStale       // 55F01
	sqlstateMissing     = rewrite.CodeMissing     // 55F02
	sqlstateInvalid     = rewrite.CodeInvalid     // 55F03
	sqlstateUnfenceable = rewrite.CodeUnfenceable // 55F04

	sqlstateProtocolViolation = "08P01" // invalid message from the client
	// A text the database's encoding has no spelling for (character_not_in_repertoire, untranslatable_character):
	// auth.query's answer for a user name no role of that database can have.
	sqlstateNotInRepertoire = "22021"
	sqlstateUntranslatable  = "22P05"
	// PostgreSQL's codes for failed logins (auth.go): a wrong password, or a login refused otherwise.
	sqlstateInvalidPassword      = "28P01"
	sqlstateInvalidAuthorization = "28000"
	sqlstateInvalidCatalogName   = "3D000" // a database name the proxy will not pool (pooled.go)
	sqlstateConnectionFailure    = "08006" // the upstream could not be reached or was lost
	// the upstream was lost while a statement ran: whether its transaction committed is unknown
	sqlstateTransactionResolutionUnknown = "08007"
	sqlstateFeatureNotSupported          = "0A000" // an unsupported frontend protocol version
	sqlstateTooManyConnections           = "53300" // limits.max_client_connections reached
	sqlstateCannotConnectNow             = "57P03" // the proxy is shutting down and takes no new session
	sqlstateAdminShutdown                = "57P01" // a drain closed an idle session
	sqlstateUndefinedPrepared            = "26000" // EXECUTE of a prepared statement that does not exist (prepared.go)
	sqlstateQueryCanceled                = "57014" // a cancel: the client's, or statement_timeout
	sqlstateNoActiveSQLTransaction       = "25P01" // the warning of SET LOCAL outside a block (writeSetLocals)
	sqlstateFencingClassPrefix           = "55F0"  // every fencing SQLSTATE starts with it
)

// templateFault reports whether an error of a PREPARE of a fenced template (prepared.go) says the template
// itself cannot be prepared, on any connection: the grammar needs a literal where it has a parameter, a
// parameter's type cannot be told or is told two ways. Any other error (a table the session's search_path does
// not reach, a privilege, a name the client took, a cancel) fails the PREPARE on that connection only.
func templateFault(code string) bool {
	switch code {
	case "42601", // syntax_error ("type modifiers must be simple constants or identifiers")
		"42P18", // indeterminate_datatype
		"42P08", // ambiguous_parameter
		"42804", // datatype_mismatch ("inconsistent types deduced for parameter")
		"42725", // ambiguous_function
		"42846": // cannot_coerce
		return true
	}
	return false
}

// transientFault reports whether an error of a PREPARE of a fenced template (prepared.go) says it failed for the
// moment only: a lock it did not wait for, a deadlock it was chosen to break, a cancel (the client's, meant for
// the statement behind it, or statement_timeout).
func transientFault(code string) bool {
	switch code {
	case "55P03", // lock_not_available
		"40P01", // deadlock_detected
		sqlstateQueryCanceled:
		return true
	}
	return false
}

// Answers to SSLRequest and GSSENCRequest.
const (
	negotiateAccept byte = 'S'
	negotiateRefuse byte = 'N'
)
